"""``async def`` handlers run on the worker's event loop, beside sync handlers on threads."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sa_jobqueue import JobContext, JobQueue, Worker
from sa_jobqueue.database import create_engine
from sa_jobqueue.models import Job
from tests.support import running, wait_for

EFFECTS = sa.table("effects", sa.column("n", sa.Integer))


@pytest.fixture
def db(database_url: URL) -> Iterator[sa.Engine]:
    engine = create_engine(database_url, pool_size=10)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE effects (n int PRIMARY KEY)")
    yield engine
    engine.dispose()


def statuses(engine: sa.Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(sa.select(Job.status, sa.func.count()).group_by(Job.status)).all()
    return {status: n for status, n in rows}


def effects(engine: sa.Engine) -> list[int]:
    with engine.connect() as conn:
        return sorted(conn.execute(sa.select(EFFECTS.c.n)).scalars())


def test_async_session_writes_commit_with_the_completion_or_roll_back(db: sa.Engine) -> None:
    queue = JobQueue()

    @queue.task(max_attempts=1)
    async def record(ctx: JobContext, n: int) -> None:
        await ctx.async_session.execute(sa.insert(EFFECTS).values(n=n))
        await ctx.async_session.commit()  # only flushes: the worker commits
        if n % 5 == 0:
            raise ValueError("fails after writing")

    with Session(db) as session:
        queue.enqueue_many(session, "record", list(range(20)))
        session.commit()
    Worker(queue, db, concurrency=4, listen=False, retention=None).run(burst=True)

    assert statuses(db) == {"succeeded": 16, "dead": 4}
    assert effects(db) == [n for n in range(20) if n % 5]


def test_async_handlers_run_while_every_thread_is_busy(db: sa.Engine) -> None:
    queue = JobQueue()
    release = threading.Event()
    both_waiting = 0

    @queue.task(queue="sync")
    def blocking(ctx: JobContext, payload: None) -> None:
        release.wait(20)

    @queue.task(queue="async")
    async def cooperative(ctx: JobContext, payload: None) -> None:
        # Both async jobs must be running at once for either to get past this point.
        nonlocal both_waiting
        both_waiting += 1
        while both_waiting < 2:
            await asyncio.sleep(0.01)

    with Session(db) as session:
        queue.enqueue_many(session, "blocking", [None, None])
        session.commit()
    worker = Worker(queue, db, concurrency=2, prefetch=0, listen=False, retention=None)
    with running(worker):
        wait_for(lambda: statuses(db).get("running") == 2)  # both threads now blocked
        with Session(db) as session:
            queue.enqueue_many(session, "cooperative", [None, None])
            session.commit()
        wait_for(lambda: statuses(db).get("succeeded") == 2)
        assert statuses(db)["running"] == 2  # the sync ones still hold both threads
        release.set()
        wait_for(lambda: statuses(db) == {"succeeded": 4})


def test_async_session_outside_an_async_handler_is_refused() -> None:
    ctx = JobContext(job_id=1, task="t", queue="q", attempt=1, max_attempts=1, session=Session())
    with pytest.raises(RuntimeError, match="async def handler"):
        _ = ctx.async_session
