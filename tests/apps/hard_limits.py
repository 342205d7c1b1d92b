"""The tasks the hard time limit tests (tests/acceptance/test_hard_timeouts.py) run.

Each writes its effect through ``ctx.session`` (``hard_effects``: no unique key on the job, so
only the fenced completion keeps a killed attempt's row out) and, where it must be killed,
then waits far past its limit with the row written and uncommitted.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from sa_jobqueue import Backoff, JobContext, JobQueue
from tests.apps import common

metadata = sa.MetaData()
effects = common.effects_table("hard_effects", metadata, one_per_job=False)

queue = JobQueue()
SOON = Backoff(base=timedelta(milliseconds=100), cap=timedelta(milliseconds=100), jitter=0)


def _write(ctx: JobContext) -> None:
    ctx.session.execute(
        effects.insert().values(job_id=ctx.job_id, attempt=ctx.attempt, pid=os.getpid())
    )


@queue.task(hard_timeout=timedelta(seconds=1), backoff=SOON, max_attempts=3)
def stall_first(ctx: JobContext, payload: Any) -> None:
    """Its first attempt writes and then hangs (killed at 1 s); the next one completes."""
    _write(ctx)
    if ctx.attempt == 1:
        time.sleep(120)


@queue.task(hard_timeout=timedelta(seconds=5), max_attempts=1)
def stall(ctx: JobContext, payload: Any) -> None:
    """Writes, then hangs for good: every attempt is killed."""
    _write(ctx)
    time.sleep(120)


@queue.task(hard_timeout=timedelta(seconds=60), max_attempts=1)
def hang(ctx: JobContext, payload: Any) -> None:
    """Writes, then hangs well inside its limit: only a cancellation ends it soon."""
    _write(ctx)
    time.sleep(120)


@queue.task(hard_timeout=timedelta(seconds=30), keep_result=True, max_attempts=1)
def report_pid(ctx: JobContext, payload: Any) -> dict[str, int]:
    """Writes, and returns the pid its attempt ran in (kept as the job's result)."""
    _write(ctx)
    return {"pid": os.getpid()}


@queue.task(hard_timeout=timedelta(seconds=30), max_attempts=1)
def fail(ctx: JobContext, payload: Any) -> None:
    """Writes, then raises: the write is rolled back, the error kept as raised."""
    _write(ctx)
    raise LookupError("no such thing")
