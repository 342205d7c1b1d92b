"""The tasks tests/acceptance/test_shutdown_and_cancel.py runs in real worker subprocesses.

Timeouts, cancellation and shutdown: handlers that watch ``ctx.stop_requested`` or
``ctx.cancel_requested``, handlers that ignore them, and handlers that block on a gate file the
test creates (or never creates).

Every handler records its execution in ``lifecycle_runs`` through its own autocommit
connection, so that table counts every execution, including attempts whose transaction was
rolled back or whose worker exited at once. The audit row also says when the handler returned
and which flags it had seen by then. Writes that must happen at most once go to
``lifecycle_effects`` through ``ctx.session`` and commit with the job's completion.

``lifecycle_effects`` has no unique constraint on ``job_id``: only the worker's fenced
completion (or the rollback of a stopped attempt) keeps an attempt's effect out.

The tables and the writes are built with :mod:`tests.apps.common`; the tests create both
tables with :data:`metadata` in their own database.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from sa_jobqueue import Backoff, JobContext, JobQueue
from tests.apps import common

metadata = sa.MetaData()

#: No unique key on ``job_id`` (see the module's docstring).
effects = common.effects_table("lifecycle_effects", metadata, one_per_job=False)

#: ``returned_at`` and the flags are set when the handler is about to return.
runs = common.runs_table(
    "lifecycle_runs",
    metadata,
    *common.started_and_returned(),
    sa.Column("stop_seen", sa.Boolean),
    sa.Column("cancel_seen", sa.Boolean),
)

queue = JobQueue()

#: Longest a handler waits for something the test controls before giving up (seconds). Far
#: beyond what any test waits, so a handler that gives up is a failure the test will notice.
HANDLER_WAIT = 30.0
#: How often the waiting handlers look at their flags (seconds).
FLAG_POLL = 0.02

recorder = common.Recorder(runs, effects, pool_size=4, max_overflow=4)
record_run = recorder.record_run
write_effect = recorder.write_effect


def record_return(ctx: JobContext, run_id: int) -> None:
    """Note in the audit that the handler is about to return, and what it had been told."""
    with recorder.engine(ctx).connect() as conn:
        conn.execute(
            runs.update()
            .where(runs.c.id == run_id)
            .values(
                returned_at=sa.func.now(),
                stop_seen=ctx.stop_requested,
                cancel_seen=ctx.cancel_requested,
            )
        )


def _until_stop(ctx: JobContext) -> None:
    deadline = time.monotonic() + HANDLER_WAIT
    while not ctx.stop_requested and time.monotonic() < deadline:
        time.sleep(FLAG_POLL)


@queue.task
def quick(ctx: JobContext, payload: Any) -> None:
    """Short work: the effect, at once."""
    record_run(ctx)
    write_effect(ctx)


@queue.task(
    timeout=timedelta(seconds=1),
    max_attempts=2,
    lease=timedelta(seconds=4),
    backoff=Backoff(base=timedelta(milliseconds=200), cap=timedelta(seconds=1), jitter=0),
)
def overrun(ctx: JobContext, payload: Any) -> None:
    """Write the effect, then work until told to stop (the timeout), and return at once.

    The effect is written before the run is recorded, so once the test sees the audit row the
    write is already in the attempt's open transaction.
    """
    write_effect(ctx)
    run_id = record_run(ctx)
    _until_stop(ctx)
    record_return(ctx, run_id)


@queue.task(timeout=timedelta(seconds=1), max_attempts=1, lease=timedelta(seconds=5))
def crunch(ctx: JobContext, payload: Any) -> None:
    """Write the effect, then CPU-bound work in small steps, looking at ``ctx.stop_requested``
    between them as the README asks; return as soon as it is up (nothing else to do)."""
    write_effect(ctx)
    record_run(ctx)
    deadline = time.monotonic() + HANDLER_WAIT
    while not ctx.stop_requested and time.monotonic() < deadline:
        sum(range(1_000))  # one step of the work


@queue.task(timeout=timedelta(seconds=1), max_attempts=1, lease=timedelta(seconds=5))
def oblivious(ctx: JobContext, payload: Any) -> None:
    """Sleep ``payload["seconds"]`` without looking at any flag, then write the effect."""
    run_id = record_run(ctx)
    time.sleep(payload["seconds"])
    write_effect(ctx)
    record_return(ctx, run_id)


@queue.task(
    timeout=timedelta(seconds=1),
    max_attempts=2,
    lease=timedelta(seconds=3),
    backoff=Backoff(base=timedelta(milliseconds=200), cap=timedelta(seconds=1), jitter=0),
)
def overlapping(ctx: JobContext, payload: Any) -> None:
    """Attempt 1 ignores its timeout and blocks until ``payload["gate"]`` exists; attempt 2
    (claimed while attempt 1 still runs) watches ``ctx.stop_requested`` as it should."""
    run_id = record_run(ctx)
    if ctx.attempt == 1:
        common.wait_for_file(Path(payload["gate"]), HANDLER_WAIT)
    else:
        write_effect(ctx)
        _until_stop(ctx)
    record_return(ctx, run_id)


@queue.task(lease=timedelta(milliseconds=1500))
def cancellable(ctx: JobContext, payload: Any) -> None:
    """Write the effect, then wait until the job's cancellation is requested; return normally."""
    write_effect(ctx)
    run_id = record_run(ctx)
    deadline = time.monotonic() + HANDLER_WAIT
    while not ctx.cancel_requested and time.monotonic() < deadline:
        time.sleep(0.02)
    record_return(ctx, run_id)


@queue.task(
    max_attempts=3, backoff=Backoff(base=timedelta(hours=1), cap=timedelta(hours=1), jitter=0)
)
def fails_first(ctx: JobContext, payload: Any) -> None:
    """Fail the first attempt (the retry is an hour away); succeed afterwards."""
    record_run(ctx)
    if ctx.attempt == 1:
        raise RuntimeError("first attempt fails on purpose")
    write_effect(ctx)


@queue.task
def gated(ctx: JobContext, payload: Any) -> None:
    """Work that lasts until the test creates the file ``payload["gate"]``."""
    run_id = record_run(ctx)
    common.wait_for_file(Path(payload["gate"]), HANDLER_WAIT)
    write_effect(ctx)
    record_return(ctx, run_id)


@queue.task(lease=timedelta(seconds=2))
def blocks_first(ctx: JobContext, payload: Any) -> None:
    """Attempt 1 blocks on ``payload["gate"]``, which the test never creates; later attempts
    write the effect and return."""
    run_id = record_run(ctx)
    if ctx.attempt == 1:
        common.wait_for_file(Path(payload["gate"]), HANDLER_WAIT)
    write_effect(ctx)
    record_return(ctx, run_id)
