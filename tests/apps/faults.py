"""The tasks the fault-injection tests (tests/acceptance/test_faults.py) run in worker processes.

Every handler records its execution in ``fault_runs`` through its own autocommit connection, so
that table counts every execution, including attempts whose transaction was rolled back. Writes
that must happen exactly once go to ``fault_effects`` through ``ctx.session`` and commit with
the job's completion.

``fault_effects`` deliberately has no unique constraint on ``job_id``: two attempts of one job
can both insert their row without blocking each other, so only the worker's fenced completion
stands between a stale attempt and a duplicate effect.

The tables and the writes are built with :mod:`tests.apps.common`; the tests create both
tables with :data:`metadata` in their own database.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from sa_jobqueue import JobContext, JobQueue
from tests.apps import common

metadata = sa.MetaData()

#: Deliberately no unique key on ``job_id`` (see the module's docstring).
effects = common.effects_table("fault_effects", metadata, one_per_job=False)

#: ``returned_at`` is set when the handler returns (only by the handlers that say so below).
runs = common.runs_table("fault_runs", metadata, *common.started_and_returned())

queue = JobQueue()

#: Longest a handler waits for something the test controls before giving up (seconds).
HANDLER_WAIT = 60.0

# Pre-ping: after a server restart the pooled connections are dead, and the audit should not
# turn into the reason an attempt fails.
recorder = common.Recorder(runs, effects, pool_size=4, max_overflow=8, pool_pre_ping=True)
record_run = recorder.record_run
#: The exactly-once effect: committed together with the job's completion, or not at all.
write_effect = recorder.write_effect


def record_return(ctx: JobContext, run_id: int) -> None:
    """Note in the audit that the handler is about to return (its completion comes next)."""
    with recorder.engine(ctx).connect() as conn:
        conn.execute(runs.update().where(runs.c.id == run_id).values(returned_at=sa.func.now()))


@queue.task
def effect(ctx: JobContext, payload: Any) -> None:
    record_run(ctx)
    write_effect(ctx)


@queue.task(lease=timedelta(seconds=1))
def long_job(ctx: JobContext, payload: Any) -> None:
    """Work for ``payload["seconds"]``, far longer than the lease: only heartbeats keep it."""
    run_id = record_run(ctx)
    time.sleep(payload["seconds"])
    write_effect(ctx)
    record_return(ctx, run_id)


@queue.task(lease=timedelta(seconds=2))
def freezable(ctx: JobContext, payload: Any) -> None:
    """Write the effect, then (first attempt only) block until ``payload["gate"]`` exists.

    The effect is written before the run is recorded, so once the test sees the audit row the
    write is already in the job's open transaction.
    """
    write_effect(ctx)
    run_id = record_run(ctx)
    if ctx.attempt == 1:
        common.wait_for_file(Path(payload["gate"]), HANDLER_WAIT)
    record_return(ctx, run_id)


@queue.task(lease=timedelta(seconds=2))
def through_restart(ctx: JobContext, payload: Any) -> None:
    """A little work between the audit and the effect, so a restart lands inside handlers."""
    record_run(ctx)
    time.sleep(0.05)
    write_effect(ctx)


class Interrupted(Exception):
    """What ``cooperative`` raises when it stops early and its payload says to raise."""


@queue.task
def cooperative(ctx: JobContext, payload: Any) -> None:
    """Long work in small steps, looking at ``ctx.stop_requested`` between them.

    Once asked to stop it writes its effect and returns, or (``payload["raise"]``) raises
    :class:`Interrupted`, as a handler that gives up part-way would.
    """
    run_id = record_run(ctx)
    deadline = time.monotonic() + HANDLER_WAIT
    while not ctx.stop_requested and time.monotonic() < deadline:
        time.sleep(0.02)
    write_effect(ctx)
    record_return(ctx, run_id)
    if payload.get("raise"):
        raise Interrupted("stopped part-way")
