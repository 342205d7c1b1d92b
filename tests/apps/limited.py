"""Tasks for the cluster-wide limits, run by real worker subprocesses (queue ``limited``).

Each handler records its run in ``limited_runs`` through an autocommit connection of its own:
when it started and when it was about to return or raise, by the database's
``clock_timestamp()``, and the key it ran under. The exactly-once effect goes to
``limited_effects`` through ``ctx.session`` and commits with the job's completion.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from sa_jobqueue import JobContext, JobQueue
from tests.apps import common

metadata = sa.MetaData()
effects = common.effects_table("limited_effects", metadata, one_per_job=True)
runs = common.runs_table(
    "limited_runs",
    metadata,
    sa.Column("key", sa.Text),
    sa.Column("started", sa.DateTime(timezone=True), nullable=False),
    sa.Column("ended", sa.DateTime(timezone=True)),
)

queue = JobQueue(default_queue="limited")
recorder = common.Recorder(runs, effects, pool_size=10, max_overflow=10, pool_pre_ping=False)


def _run(ctx: JobContext, payload: Any, *, write: bool = True) -> None:
    if payload.get("fail_first") and ctx.attempt == 1:
        # An attempt that fails before its start is recorded, as one can on a loaded machine
        # (its audit connection refused, say): the job is retried after its backoff.
        raise RuntimeError("the first attempt fails before the handler starts")
    r = runs.c
    engine = recorder.engine(ctx)
    with engine.connect() as conn:
        run_id = conn.execute(
            runs.insert()
            .values(
                job_id=ctx.job_id,
                attempt=ctx.attempt,
                pid=os.getpid(),
                key=None if payload.get("customer") is None else str(payload["customer"]),
                started=sa.func.clock_timestamp(),
            )
            .returning(r.id)
        ).scalar_one()
    try:
        time.sleep(payload.get("ms", 0) / 1000)
        if write:
            recorder.write_effect(ctx)
    finally:
        # The run is over whether it returns or raises (its attempt then fails and is retried):
        # only a killed worker, or a failure of this very record, leaves a run with no end.
        with engine.connect() as conn:
            conn.execute(
                runs.update().where(r.id == run_id).values(ended=sa.func.clock_timestamp())
            )


@queue.task
def work(ctx: JobContext, payload: Any) -> None:
    """Waits ``payload["ms"]`` milliseconds between its start and end records; with
    ``payload["fail_first"]``, its first attempt raises before recording anything."""
    _run(ctx, payload)


@queue.task(lease=timedelta(seconds=2))
def short_lease(ctx: JobContext, payload: Any) -> None:
    """:func:`work` with a 2 s lease: a killed worker's jobs come back quickly."""
    _run(ctx, payload)


@queue.task(queue="other")
def other(ctx: JobContext, payload: Any) -> None:
    """:func:`work`, in the queue ``other``."""
    _run(ctx, payload)


@queue.task
def unwritten(ctx: JobContext, payload: Any) -> None:
    """:func:`work` without the effect: nothing goes through ``ctx.session``, so the worker
    completes it in a batch, where a job holding a slot hands it to the next at once."""
    _run(ctx, payload, write=False)
