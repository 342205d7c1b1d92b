"""``async def`` handlers run on the worker's event loop, beside sync handlers on threads."""

from __future__ import annotations

import asyncio
import threading

import sqlalchemy as sa
from sqlalchemy.orm import Session

from sa_jobqueue import JobContext, JobQueue, Worker
from tests.helpers.jobs import statuses
from tests.helpers.waiting import running, wait_for

EFFECTS = sa.table("effects", sa.column("n", sa.Integer))


TABLES = "CREATE TABLE effects (n int PRIMARY KEY)"


def effect_ns(engine: sa.Engine) -> list[int]:
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
    assert effect_ns(db) == [n for n in range(20) if n % 5]


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
