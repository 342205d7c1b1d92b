"""The tasks the network tests (tests/acceptance/test_network.py) run in real worker subprocesses.

``write`` inserts one row through ``ctx.session``: the exactly-once effect, committed with the
job's completion. ``touch`` writes nothing to the database; it appends ``job_id attempt pid``
to the file named by ``SAJQ_TEST_RUNS_FILE``, so every execution is counted even where the
database cannot be reached (each line is one ``write(2)`` on an ``O_APPEND`` descriptor, which
concurrent processes never interleave). ``write_briefly`` is ``write`` with a lease of a few
seconds, for tests that wait for lost jobs to be reclaimed.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from sa_jobqueue import Backoff, BatchContext, BatchJob, JobContext, JobQueue
from tests.apps import common

metadata = sa.MetaData()

#: No unique key on ``job_id``: a second effect of a job would be counted, not refused.
effects = common.effects_table("network_effects", metadata, one_per_job=False)

queue = JobQueue()


@queue.task
def write(ctx: JobContext, payload: Any) -> None:
    ctx.session.execute(
        effects.insert().values(job_id=ctx.job_id, attempt=ctx.attempt, pid=os.getpid())
    )


@queue.task
def touch(ctx: JobContext, payload: Any) -> None:
    note_run(ctx)


@queue.task(lease=timedelta(seconds=4))
def touch_briefly(ctx: JobContext, payload: Any) -> None:
    """``touch`` with a short lease: a job whose outcome was lost runs again within seconds."""
    note_run(ctx)


@queue.task(lease=timedelta(seconds=4), backoff=Backoff(base=timedelta(milliseconds=100)))
def fail_once_briefly(ctx: JobContext, payload: Any) -> None:
    """Fails its first attempt, succeeds the next: each outcome recorded on its own."""
    note_run(ctx)
    if ctx.attempt == 1:
        raise RuntimeError("the first attempt fails")


def note_run(ctx: JobContext) -> None:
    """Append ``job_id attempt pid`` to the runs file."""
    note_run_of(ctx.job_id, ctx.attempt)


def note_run_of(job_id: int, attempt: int) -> None:
    """:func:`note_run` for a job of a batch."""
    line = f"{job_id} {attempt} {os.getpid()}\n".encode()
    fd = os.open(os.environ["SAJQ_TEST_RUNS_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


@queue.task(lease=timedelta(seconds=4))
def write_briefly(ctx: JobContext, payload: Any) -> None:
    """``write`` with a short lease: a job whose outcome was lost is reclaimed within seconds."""
    ctx.session.execute(
        effects.insert().values(job_id=ctx.job_id, attempt=ctx.attempt, pid=os.getpid())
    )


@queue.task
def write_after_a_while(ctx: JobContext, payload: Any) -> None:
    """``write`` after holding its thread for ``payload["seconds"]``: busy when the network goes
    silent, and its write then waits on a silent connection."""
    time.sleep(payload["seconds"])  # the handler's work, which ignores stop requests
    ctx.session.execute(
        effects.insert().values(job_id=ctx.job_id, attempt=ctx.attempt, pid=os.getpid())
    )


@queue.task(lease=timedelta(seconds=60))
def write_then_lose_it(ctx: JobContext, payload: Any) -> None:
    """``write``, whose first attempt then has its connection terminated before the commit:
    its writes are lost with it, and its outcome cannot be recorded. A lease of a minute, so
    that a retry within seconds cannot be the lease's expiry."""
    ctx.session.execute(
        effects.insert().values(job_id=ctx.job_id, attempt=ctx.attempt, pid=os.getpid())
    )
    if ctx.attempt == 1:
        bind = ctx.session.get_bind()
        backend = ctx.session.execute(sa.select(sa.func.pg_backend_pid())).scalar_one()
        other = sa.create_engine(bind.engine.url, poolclass=sa.pool.NullPool)
        try:
            with other.connect() as conn:
                conn.execute(sa.select(sa.func.pg_terminate_backend(backend)))
        finally:
            other.dispose()


@queue.task(timeout=timedelta(seconds=2), max_attempts=1)
def hang(ctx: JobContext, payload: Any) -> None:
    """A statement through ``ctx.session`` that does not answer for a minute, as on a silent
    network: only the task's timeout can free its thread."""
    ctx.session.execute(sa.select(sa.func.pg_sleep(60)))


@queue.task(lease=timedelta(seconds=6))
def sleep_in_session(ctx: JobContext, payload: Any) -> None:
    """A statement of a few seconds through ``ctx.session``, long enough to go silent under."""
    note_run(ctx)
    ctx.session.execute(sa.select(sa.func.pg_sleep(payload["seconds"])))


@queue.batch_task(max_size=10, lease=timedelta(seconds=6))
def sleep_in_batch_session(ctx: BatchContext, jobs: list[BatchJob[Any]]) -> None:
    """``sleep_in_session`` for a batch: one statement through the batch's session."""
    for job in jobs:
        note_run_of(job.id, job.attempt)
    ctx.session.execute(sa.select(sa.func.pg_sleep(jobs[0].payload["seconds"])))
