"""The tasks the fault-injection tests (tests/test_faults.py) run in real worker subprocesses.

Every handler records its execution in ``fault_runs`` through its own autocommit connection, so
that table counts every execution, including attempts whose transaction was rolled back. Writes
that must happen exactly once go to ``fault_effects`` through ``ctx.session`` and commit with
the job's completion.

``fault_effects`` deliberately has no unique constraint on ``job_id``: two attempts of one job
can both insert their row without blocking each other, so only the worker's fenced completion
stands between a stale attempt and a duplicate effect.

The tests create both tables with :data:`metadata` in their own database.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from sa_jobqueue import JobContext, JobQueue
from sa_jobqueue.database import create_engine

metadata = sa.MetaData()

effects = sa.Table(
    "fault_effects",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("job_id", sa.BigInteger, nullable=False, index=True),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
)

runs = sa.Table(
    "fault_runs",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("job_id", sa.BigInteger, nullable=False, index=True),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("started_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
    # Set when the handler returns (only by the handlers that say so below).
    sa.Column("returned_at", sa.DateTime(timezone=True)),
)

queue = JobQueue()

#: Longest a handler waits for something the test controls before giving up (seconds).
HANDLER_WAIT = 60.0

_audit_lock = threading.Lock()
_audit_engine: sa.Engine | None = None


def _audit(ctx: JobContext) -> sa.Engine:
    """This process's autocommit engine, on the same database the worker uses."""
    global _audit_engine
    with _audit_lock:
        if _audit_engine is None:
            url = ctx.session.get_bind().engine.url
            # Pre-ping: after a server restart the pooled connections are dead, and the audit
            # should not turn into the reason an attempt fails.
            _audit_engine = create_engine(
                url, isolation_level="AUTOCOMMIT", pool_size=4, max_overflow=8
            )
        return _audit_engine


def record_run(ctx: JobContext) -> int:
    """Count this execution outside the job's transaction; return the audit row's id."""
    with _audit(ctx).connect() as conn:
        return int(
            conn.execute(
                runs.insert()
                .values(job_id=ctx.job_id, attempt=ctx.attempt, pid=os.getpid())
                .returning(runs.c.id)
            ).scalar_one()
        )


def record_return(ctx: JobContext, run_id: int) -> None:
    """Note in the audit that the handler is about to return (its completion comes next)."""
    with _audit(ctx).connect() as conn:
        conn.execute(runs.update().where(runs.c.id == run_id).values(returned_at=sa.func.now()))


def write_effect(ctx: JobContext) -> None:
    """The exactly-once effect: committed together with the job's completion, or not at all."""
    ctx.session.execute(
        effects.insert().values(job_id=ctx.job_id, attempt=ctx.attempt, pid=os.getpid())
    )


def _wait_for_file(path: Path) -> None:
    deadline = time.monotonic() + HANDLER_WAIT
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.02)


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
        _wait_for_file(Path(payload["gate"]))
    record_return(ctx, run_id)


@queue.task(lease=timedelta(seconds=2))
def through_restart(ctx: JobContext, payload: Any) -> None:
    """A little work between the audit and the effect, so a restart lands inside handlers."""
    record_run(ctx)
    time.sleep(0.05)
    write_effect(ctx)
