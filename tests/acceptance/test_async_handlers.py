"""``async def`` handlers run on the worker's event loop, beside sync handlers on threads."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta

import sqlalchemy as sa
from sqlalchemy.orm import Session

from sa_jobqueue import JobContext, JobQueue, Worker
from sa_jobqueue.models import jobs_table
from tests.helpers.jobs import job, statuses
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


def test_a_cancelled_async_handler_stops_at_its_next_await_and_its_writes_roll_back(
    db: sa.Engine,
) -> None:
    queue = JobQueue()
    seen: list[str] = []

    @queue.task(lease=timedelta(seconds=1.5))
    async def patient(ctx: JobContext, n: int) -> None:
        await ctx.async_session.execute(sa.insert(EFFECTS).values(n=n))
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    with Session(db) as session, session.begin():
        job_id = queue.enqueue(session, "patient", 1)
    with running(Worker(queue, db, concurrency=1, listen=False, retention=None)):
        wait_for(lambda: job(db, job_id).status == "running")
        with Session(db) as session, session.begin():
            assert queue.cancel(session, job_id) is True
        wait_for(lambda: job(db, job_id).status != "running")
    row = job(db, job_id)
    assert (row.status, row.attempts) == ("cancelled", 1)
    assert seen == ["cancelled"]
    assert effect_ns(db) == []


def test_a_stale_async_attempt_commits_nothing(db: sa.Engine) -> None:
    queue = JobQueue()

    @queue.task(max_attempts=5)
    async def writes(ctx: JobContext, n: int) -> None:
        await ctx.async_session.execute(sa.insert(EFFECTS).values(n=n))
        # Meanwhile the job was claimed again (as after a lost lease): this attempt is stale.
        with db.begin() as conn:
            conn.execute(
                sa.update(jobs_table)
                .where(jobs_table.c.id == ctx.job_id)
                .values(attempts=jobs_table.c.attempts + 1)
            )

    with Session(db) as session, session.begin():
        job_id = queue.enqueue(session, "writes", 1)
    Worker(queue, db, concurrency=1, listen=False, retention=None).run(burst=True)
    row = job(db, job_id)
    assert (row.status, row.attempts) == ("running", 2)  # the newer attempt's, untouched
    assert effect_ns(db) == []


def test_shutdown_hands_back_the_async_jobs_that_had_not_started(db: sa.Engine) -> None:
    queue = JobQueue()
    started: list[int] = []

    @queue.task
    async def waits(ctx: JobContext, n: int) -> None:
        started.append(n)
        while not ctx.stop_requested:
            await asyncio.sleep(0.01)

    with Session(db) as session, session.begin():
        queue.enqueue_many(session, "waits", [1, 2, 3])
    worker = Worker(queue, db, concurrency=1, prefetch=2, listen=False, retention=None)
    with running(worker):
        # One runs; the other two are claimed and wait for the one slot.
        wait_for(lambda: statuses(db) == {"running": 3} and len(started) == 1)
    assert len(started) == 1
    with db.connect() as conn:
        rows = conn.execute(
            sa.select(jobs_table.c.payload, jobs_table.c.status, jobs_table.c.attempts)
        )
        by_payload = {row.payload: (row.status, row.attempts) for row in rows}
    assert by_payload.pop(started[0]) == ("succeeded", 1)  # it returned when asked to stop
    assert by_payload == {n: ("queued", 0) for n in {1, 2, 3} - {started[0]}}  # uncounted
