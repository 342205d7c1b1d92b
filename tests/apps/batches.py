"""Batch tasks the acceptance tests run, in-process and in real worker subprocesses.

Each handler counts its run of every job in ``batch_runs`` through an autocommit connection of
its own (survives rollbacks and kills), and writes one row per job it succeeds to
``batch_rows`` through ``ctx.session``, in one multi-row INSERT: that table has no key on
``job_id``, so only the fenced completion stands between a stale batch and a duplicate row.
A payload ``{"hold": "<path>"}`` makes the handler wait, after its INSERT, until that file
exists (the test creates it), so a test can act while the batch is mid-way.
"""

from __future__ import annotations

import asyncio
import os
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from sa_jobqueue import BatchContext, BatchJob, JobQueue
from sa_jobqueue.database import create_engine
from tests.apps.common import wait_for_file

metadata = sa.MetaData()

rows = sa.Table(
    "batch_rows",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("job_id", sa.BigInteger, nullable=False, index=True),
    sa.Column("batch_size", sa.Integer, nullable=False),
    sa.Column("tenant", sa.Text),
)
runs = sa.Table(
    "batch_runs",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("job_id", sa.BigInteger, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
)

queue = JobQueue()

#: Longest a held handler waits for its file (seconds).
HOLD_WAIT = 60.0

_lock = threading.Lock()
_engines: dict[str, sa.Engine] = {}


def _record_runs(bind: sa.Engine, jobs: list[BatchJob[Any]]) -> None:
    """Count this run of each job outside the batch's transaction."""
    url = bind.url.render_as_string(hide_password=False)
    with _lock:
        engine = _engines.get(url)
        if engine is None:
            engine = _engines[url] = create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(
            runs.insert(),
            [{"job_id": j.id, "attempt": j.attempt, "pid": os.getpid()} for j in jobs],
        )


def _values(jobs: list[BatchJob[Any]]) -> list[dict[str, Any]]:
    return [
        {"job_id": j.id, "batch_size": len(jobs), "tenant": j.payload.get("tenant")} for j in jobs
    ]


@queue.batch_task(max_size=50, max_wait=timedelta(milliseconds=100), lease=timedelta(seconds=2))
def write_rows(ctx: BatchContext, jobs: list[BatchJob[dict[str, Any]]]) -> None:
    """One row per job, but for jobs marked ``fail``, ``retry`` or ``discard``."""
    _record_runs(ctx.session.get_bind().engine, jobs)  # type: ignore[union-attr]
    kept = []
    for job in jobs:
        verdict = job.payload.get("verdict")
        if verdict == "fail":
            ctx.fail(job, "asked to fail")
        elif verdict == "retry":
            ctx.retry(job, after=timedelta(hours=1))
        elif verdict == "discard":
            ctx.discard(job, "asked to discard")
        else:
            kept.append(job)
    if kept:
        ctx.session.execute(rows.insert(), _values(kept))
    for job in jobs:
        if "hold" in job.payload:
            wait_for_file(Path(job.payload["hold"]), HOLD_WAIT)
            break
    if any(job.payload.get("raise") for job in jobs):
        raise RuntimeError("the batch failed")


@queue.batch_task(max_size=50, max_wait=timedelta(seconds=5))
def slow_fill(ctx: BatchContext, jobs: list[BatchJob[dict[str, Any]]]) -> None:
    """One row per job, from a batch that fills for up to 5 s: a test acts while it forms."""
    _record_runs(ctx.session.get_bind().engine, jobs)  # type: ignore[union-attr]
    ctx.session.execute(rows.insert(), _values(jobs))


@queue.batch_task(max_size=10, max_wait=timedelta(milliseconds=50), batch_key="tenant")
def per_tenant(ctx: BatchContext, jobs: list[BatchJob[dict[str, Any]]]) -> None:
    """One row per job; a batch holds one tenant's jobs."""
    ctx.session.execute(rows.insert(), _values(jobs))


#: The async task has a queue object of its own: beside sync tasks, a worker gives async ones
#: slots of their own (twice the room), and a second leader claimed into them would make the
#: batches the other tests count depend on timing.
async_queue = JobQueue()


@async_queue.batch_task(max_size=20, max_wait=timedelta(milliseconds=50), keep_result=True)
async def async_rows(ctx: BatchContext, jobs: list[BatchJob[dict[str, Any]]]) -> list[int]:
    """An async handler writing through its async session; each job's result is its id."""
    await asyncio.sleep(0)
    await ctx.async_session.execute(rows.insert(), _values(jobs))
    return [job.id for job in jobs]
