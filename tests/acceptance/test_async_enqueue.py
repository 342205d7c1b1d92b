"""Enqueue from async code: ``aenqueue``, ``aenqueue_many``, ``acancel`` and ``aget_job`` on an
``AsyncSession`` or ``AsyncConnection`` (psycopg 3 async, ``create_async_engine``).

The promise is the sync one: the job is written in the caller's transaction and exists exactly
when that commits, nothing of the caller's is flushed, and each queue is woken once per
transaction, at commit. Each test runs its scenario with ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy import event, select
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_scoped_session,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import Session

from sa_jobqueue import Enqueued, JobQueue
from sa_jobqueue._enqueue.inserting import COPY_FROM
from sa_jobqueue.errors import PayloadError
from sa_jobqueue.models import jobs_table
from tests.apps.application import AppBase, Invoice
from tests.helpers.jobs import count, handler
from tests.helpers.notify import listening, notifications
from tests.helpers.protocol import pgconn_of, traced

T = TypeVar("T")
j = jobs_table.c


@pytest.fixture
def queue() -> JobQueue:
    queue = JobQueue()
    queue.task(name="work_a", queue="a")(handler)
    queue.task(name="work_b", queue="b")(handler)
    return queue


@pytest.fixture
def run(database_url: URL, engine: sa.Engine) -> Callable[..., Any]:
    """``run(scenario)``: ``asyncio.run`` a coroutine function given an AsyncEngine on the
    test's database (with the application's table), recording the SQL it sends."""
    AppBase.metadata.create_all(engine)
    sent: list[str] = []

    def runner(scenario: Callable[[AsyncEngine, list[str]], Awaitable[T]]) -> T:
        async def main() -> T:
            async_engine = create_async_engine(database_url)

            def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
                sent.append(statement)

            event.listen(async_engine.sync_engine, "before_cursor_execute", record)
            try:
                return await scenario(async_engine, sent)
            finally:
                await async_engine.dispose()

        return asyncio.run(main())

    return runner


def notify_statements(sent: list[str]) -> int:
    return sum("pg_notify" in statement for statement in sent)


# -- AsyncSession ---------------------------------------------------------------------------------


def test_async_session_commit_writes_the_jobs_and_wakes_each_queue_once(
    engine: sa.Engine, queue: JobQueue, run: Callable[..., Any]
) -> None:
    async def scenario(async_engine: AsyncEngine, sent: list[str]) -> list[int]:
        async with AsyncSession(async_engine) as session, session.begin():
            session.add(Invoice(note="paid"))
            ids = [await queue.aenqueue(session, "work_a", {"n": 1})]
            ids += await queue.aenqueue_many(session, "work_b", [{"n": 2}, {"n": 3}])
            ids.append(await queue.aenqueue(session, "work_a", {"n": 4}))
            ids += await queue.aenqueue_many(session, "work_a", [{"n": 5}])
            info = await queue.aget_job(session, ids[0])
            assert info is not None
            assert (info.status, info.payload) == ("queued", {"n": 1})
            assert count(engine) == 0  # not visible before the commit
            assert notify_statements(sent) == 2  # once per queue, not once per job
        return ids

    with listening(engine) as listener:
        ids = run(scenario)
        assert sorted(notifications(listener, engine)) == ["a", "b"]
    assert all(isinstance(i, Enqueued) and i.created for i in ids)
    assert count(engine) == 5
    assert count(engine, Invoice.__table__) == 1


def test_async_session_rollback_discards_the_jobs_and_sends_nothing(
    engine: sa.Engine, queue: JobQueue, run: Callable[..., Any]
) -> None:
    class Boom(Exception):
        pass

    async def scenario(async_engine: AsyncEngine, sent: list[str]) -> None:
        async with AsyncSession(async_engine) as session:
            job_id = await queue.aenqueue(session, "work_a", {"n": 1})
            await queue.aenqueue_many(session, "work_b", [{"n": 2}])
            await session.rollback()
            assert await queue.aget_job(session, job_id) is None

        async def business_that_fails() -> None:
            async with AsyncSession(async_engine) as session, session.begin():
                session.add(Invoice(note="never"))
                await queue.aenqueue(session, "work_a", {"n": 3})
                raise Boom

        with pytest.raises(Boom):
            await business_that_fails()

    with listening(engine) as listener:
        run(scenario)
        assert notifications(listener, engine) == []
    assert count(engine) == 0
    assert count(engine, Invoice.__table__) == 0


def test_aenqueue_neither_flushes_nor_commits(
    engine: sa.Engine, queue: JobQueue, run: Callable[..., Any]
) -> None:
    async def scenario(async_engine: AsyncEngine, sent: list[str]) -> None:
        async with AsyncSession(async_engine) as session:
            invoice = Invoice(note="pending")
            session.add(invoice)
            await queue.aenqueue(session, "work_a", {"n": 1})
            await queue.aenqueue_many(session, "work_a", [{"n": 2}])
            assert invoice in session.new
            assert session.in_transaction()
            assert not any(s.lstrip().upper().startswith("INSERT INTO APP") for s in sent)
            assert count(engine) == 0
        # Closed without a commit.

    run(scenario)
    assert count(engine) == 0
    assert count(engine, Invoice.__table__) == 0


def test_a_rolled_back_savepoint_takes_its_notification_with_it(
    engine: sa.Engine, queue: JobQueue, run: Callable[..., Any]
) -> None:
    async def scenario(async_engine: AsyncEngine, sent: list[str]) -> None:
        async with AsyncSession(async_engine) as session, session.begin():
            savepoint = await session.begin_nested()
            await queue.aenqueue(session, "work_a", {"n": "dropped"})
            await savepoint.rollback()
            await queue.aenqueue(session, "work_a", {"n": "kept"})

    with listening(engine) as listener:
        run(scenario)
        assert notifications(listener, engine) == ["a"]
    assert count(engine) == 1


@pytest.fixture
def run_unwatched(database_url: URL) -> Callable[..., Any]:
    """``run_unwatched(scenario)``: as ``run``, but nothing listens to the engine's events, so
    enqueue takes its direct paths (the INSERT straight to psycopg)."""

    def runner(scenario: Callable[[AsyncEngine], Awaitable[T]]) -> T:
        async def main() -> T:
            async_engine = create_async_engine(database_url)
            try:
                return await scenario(async_engine)
            finally:
                await async_engine.dispose()

        return asyncio.run(main())

    return runner


def test_aenqueue_goes_straight_to_the_driver_in_one_round_trip(
    engine: sa.Engine, queue: JobQueue, run_unwatched: Callable[..., Any]
) -> None:
    async def scenario(async_engine: AsyncEngine) -> list[int]:
        async with AsyncSession(async_engine) as session, session.begin():
            await session.execute(sa.text("SELECT 1"))
            pgconn = await session.run_sync(lambda sync: pgconn_of(sync.connection()))
            with traced(pgconn) as traffic:
                ids = [await queue.aenqueue(session, "work_a", {"n": n}) for n in range(3)]
            assert traffic.round_trips == 3
            assert count(engine) == 0
        return ids

    with listening(engine) as listener:
        ids = run_unwatched(scenario)
        assert notifications(listener, engine) == ["a"]
    assert ids == sorted(ids)
    with engine.connect() as conn:
        stored = dict(conn.execute(select(j.id, j.payload).where(j.id.in_(ids))).all())
    assert [stored[i] for i in ids] == [{"n": n} for n in range(3)]


def test_aenqueue_many_copies_a_large_batch_in_the_callers_transaction(
    engine: sa.Engine, queue: JobQueue, run_unwatched: Callable[..., Any]
) -> None:
    payloads = [{"n": n, "s": "tab\there \\ new\nline é"} for n in range(COPY_FROM + 1)]

    async def scenario(async_engine: AsyncEngine) -> list[int]:
        async with AsyncSession(async_engine) as session, session.begin():
            savepoint = await session.begin_nested()
            await queue.aenqueue_many(session, "work_b", payloads)
            await savepoint.rollback()
            pgconn = await session.run_sync(lambda sync: pgconn_of(sync.connection()))
            with traced(pgconn) as traffic:
                ids = await queue.aenqueue_many(session, "work_a", payloads)
            assert traffic.queries[1].startswith("COPY")
            assert count(engine) == 0
        return ids

    with listening(engine) as listener:
        ids = run_unwatched(scenario)
        assert notifications(listener, engine) == ["a"]  # not "b": its savepoint rolled back
    assert ids == sorted(ids)
    assert len(set(ids)) == len(payloads)
    with engine.connect() as conn:
        stored = dict(conn.execute(select(j.id, j.payload).where(j.id.in_(ids))).all())
    assert [stored[i] for i in ids] == payloads
    assert count(engine) == len(payloads)


@pytest.mark.parametrize("size", [1, COPY_FROM], ids=["insert", "copy"])
def test_an_async_database_error_is_raised_as_sqlalchemy_raises_it(
    engine: sa.Engine, queue: JobQueue, run_unwatched: Callable[..., Any], size: int
) -> None:
    payloads = [{"n": n} for n in range(size)]

    async def refused(async_engine: AsyncEngine) -> None:
        async with AsyncSession(async_engine) as session:
            await session.execute(sa.text("SET LOCAL lock_timeout = '50ms'"))
            with pytest.raises(sa.exc.OperationalError) as raised:
                await queue.aenqueue_many(session, "work_a", payloads)
            assert isinstance(raised.value.orig, psycopg.errors.LockNotAvailable)
            await session.rollback()

    async def accepted(async_engine: AsyncEngine) -> None:
        async with AsyncSession(async_engine) as session, session.begin():
            await queue.aenqueue_many(session, "work_a", payloads)

    with engine.connect() as holder:
        holder.execute(sa.text("LOCK TABLE sa_jobqueue_jobs IN ACCESS EXCLUSIVE MODE"))
        run_unwatched(refused)
        holder.rollback()
    run_unwatched(accepted)
    assert count(engine) == size


def test_async_scoped_session(engine: sa.Engine, queue: JobQueue, run: Callable[..., Any]) -> None:
    async def scenario(async_engine: AsyncEngine, sent: list[str]) -> None:
        scoped = async_scoped_session(
            async_sessionmaker(async_engine), scopefunc=asyncio.current_task
        )
        await queue.aenqueue(scoped, "work_a", {"n": 1})
        await scoped.commit()
        await scoped.remove()

    run(scenario)
    assert count(engine) == 1


# -- AsyncConnection ------------------------------------------------------------------------------


def test_async_connection_commit_and_rollback(
    engine: sa.Engine, queue: JobQueue, run: Callable[..., Any]
) -> None:
    async def scenario(async_engine: AsyncEngine, sent: list[str]) -> None:
        async with async_engine.connect() as conn:
            dropped = await queue.aenqueue(conn, "work_a", {"n": "dropped"})
            assert conn.in_transaction()
            await conn.rollback()
            assert await queue.aget_job(conn, dropped) is None
            await conn.rollback()
            async with conn.begin():
                await queue.aenqueue(conn, "work_a", {"n": 1})
                await queue.aenqueue_many(conn, "work_b", [{"n": 2}, {"n": 3}])
                await queue.aenqueue(conn, "work_b", {"n": 4})
                assert count(engine) == 0
            assert notify_statements(sent) == 3  # a (rolled back), then a and b once each
            # A transaction begun by aenqueue itself, committed by the caller.
            await queue.aenqueue(conn, "work_a", {"n": 5})
            await conn.commit()

    with listening(engine) as listener:
        run(scenario)
        assert notifications(listener, engine) == ["a", "b", "a"]
    assert count(engine) == 5


def test_acancel_and_aget_job(engine: sa.Engine, queue: JobQueue, run: Callable[..., Any]) -> None:
    async def scenario(async_engine: AsyncEngine, sent: list[str]) -> None:
        async with async_engine.begin() as conn:
            job_id = await queue.aenqueue(conn, "work_a", {"n": 1})
        async with AsyncSession(async_engine) as session, session.begin():
            assert await queue.acancel(session, job_id)
            assert not await queue.acancel(session, job_id)  # already finished
            info = await queue.aget_job(session, job_id)
            assert info is not None
            assert info.status == "cancelled"
        async with async_engine.connect() as conn:
            assert not await queue.acancel(conn, 10**12)
            assert await queue.aget_job(conn, 10**12) is None

    run(scenario)
    with Session(engine) as session:
        (only,) = session.execute(select(j.status)).scalars()
    assert only == "cancelled"


# -- unique keys, bad input, wrong session types ---------------------------------------------------


def test_unique_keys_from_concurrent_async_sessions(
    engine: sa.Engine, queue: JobQueue, run: Callable[..., Any]
) -> None:
    async def one(async_engine: AsyncEngine, n: int) -> Enqueued:
        async with AsyncSession(async_engine) as session, session.begin():
            return await queue.aenqueue(session, "work_a", {"n": n}, unique_key="k")

    async def scenario(async_engine: AsyncEngine, sent: list[str]) -> list[Enqueued]:
        jobs = list(await asyncio.gather(*(one(async_engine, n) for n in range(8))))
        async with async_engine.begin() as conn:
            jobs += await queue.aenqueue_many(conn, "work_a", [{}, {}], unique_keys=["k", "j"])
        return jobs

    jobs = run(scenario)
    assert [job.created for job in jobs[:8]].count(True) == 1
    assert len(set(jobs[:9])) == 1
    assert jobs[8].created is False
    assert jobs[9].created is True
    assert count(engine) == 2


def test_bad_input_raises_before_any_sql(
    engine: sa.Engine, queue: JobQueue, run: Callable[..., Any]
) -> None:
    async def scenario(async_engine: AsyncEngine, sent: list[str]) -> None:
        async with AsyncSession(async_engine) as session:
            with pytest.raises(PayloadError):
                await queue.aenqueue(session, "work_a", {"bad": {1, 2}})
            with pytest.raises(PayloadError):
                await queue.aenqueue_many(session, "work_a", [{"ok": 1}, b"bytes"])
            assert sent == []
            assert await queue.aenqueue_many(session, "work_a", []) == []
            assert sent == []
            await queue.aenqueue(session, "work_a", {"ok": True})
            await session.commit()

    run(scenario)
    assert count(engine) == 1


def test_sync_and_async_methods_refuse_each_others_sessions(
    engine: sa.Engine, queue: JobQueue, run: Callable[..., Any]
) -> None:
    async def scenario(async_engine: AsyncEngine, sent: list[str]) -> None:
        async with AsyncSession(async_engine) as session:
            with pytest.raises(TypeError, match="aenqueue"):
                queue.enqueue(session, "work_a", {})  # type: ignore[arg-type]
        with Session(engine) as sync_session:
            with pytest.raises(TypeError, match="without the 'a' prefix"):
                await queue.aenqueue(sync_session, "work_a", {})  # type: ignore[arg-type]
            with pytest.raises(TypeError):
                await queue.aget_job(async_engine, 1)  # type: ignore[arg-type]

    run(scenario)
    assert count(engine) == 0
