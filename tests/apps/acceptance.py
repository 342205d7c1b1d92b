"""The tasks the acceptance tests run in real worker subprocesses.

Every handler first records the run in ``acceptance_runs`` through its own autocommit
connection, so that table counts every execution, including attempts whose transaction was
rolled back or whose worker was killed. Writes that must happen exactly once go to
``acceptance_effects`` through ``ctx.session`` and commit with the job's completion.

The tests create both tables with :data:`metadata` in their own database.
"""

from __future__ import annotations

import os
import signal
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
    "acceptance_effects",
    metadata,
    sa.Column("job_id", sa.BigInteger, primary_key=True),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
)

runs = sa.Table(
    "acceptance_runs",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("job_id", sa.BigInteger, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
)

queue = JobQueue()

#: Not a JobQueue: the CLI must refuse it.
not_a_queue = {"this": "is a dict"}

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
            # Two connections per worker process at most: the handlers only insert one row.
            _audit_engine = create_engine(
                url,
                isolation_level="AUTOCOMMIT",
                pool_size=2,
                max_overflow=0,
                pool_pre_ping=False,
            )
        return _audit_engine


def record_run(ctx: JobContext) -> None:
    """Count this execution outside the job's transaction (it survives rollbacks and kills)."""
    with _audit(ctx).connect() as conn:
        conn.execute(runs.insert().values(job_id=ctx.job_id, attempt=ctx.attempt, pid=os.getpid()))


def write_effect(ctx: JobContext) -> None:
    """The exactly-once effect: committed together with the job's completion, or not at all."""
    ctx.session.execute(
        effects.insert().values(job_id=ctx.job_id, attempt=ctx.attempt, pid=os.getpid())
    )


@queue.task
def effect(ctx: JobContext, payload: Any) -> None:
    record_run(ctx)
    write_effect(ctx)


@queue.task(lease=timedelta(seconds=2))
def stall_first(ctx: JobContext, payload: Any) -> None:
    """Hang on the first attempt (the test SIGKILLs the worker meanwhile); succeed afterwards."""
    record_run(ctx)
    if ctx.attempt == 1:
        time.sleep(HANDLER_WAIT)
        raise RuntimeError("the test was supposed to kill this worker")
    write_effect(ctx)


@queue.task(max_attempts=3, lease=timedelta(seconds=1))
def poison(ctx: JobContext, payload: Any) -> None:
    """Kill the worker process running it, on every attempt."""
    record_run(ctx)
    os.kill(os.getpid(), signal.SIGKILL)


@queue.task
def gated(ctx: JobContext, payload: Any) -> None:
    """Work that lasts until the test creates the file ``payload["gate"]``, then a little more."""
    record_run(ctx)
    gate = Path(payload["gate"])
    deadline = time.monotonic() + HANDLER_WAIT
    while not gate.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{gate} never appeared")
        time.sleep(0.02)
    time.sleep(0.5)  # the rest of the work
    write_effect(ctx)
