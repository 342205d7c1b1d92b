"""A producer with no business transaction: ``enqueue(engine, ...)`` commits a transaction of
its own, and tries it again when the pooled connection under it turns out to be dead.

Each test has a fresh database: the jobs are committed and read back from other connections.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from sa_jobqueue import JobQueue
from sa_jobqueue.errors import InvalidScheduleError, PayloadError, UnknownTaskError
from sa_jobqueue.middleware import Enqueueing, Middleware, ProceedEnqueue
from sa_jobqueue.models import jobs_table
from tests.helpers.jobs import count, make_queue
from tests.helpers.waiting import wait_for

j = jobs_table.c


@pytest.fixture
def queue() -> JobQueue:
    return make_queue()


@pytest.fixture
def plain_engine(database_url: URL) -> Iterator[sa.Engine]:
    """An engine with nothing listening to it, so its enqueue takes the direct path."""
    engine = sa.create_engine(database_url)
    yield engine
    engine.dispose()


class Pool:
    """Counts the connections a pool makes and hands out."""

    def __init__(self, engine: sa.Engine) -> None:
        self.connects = 0
        self.checkouts = 0
        event.listen(engine, "connect", self._connect)
        event.listen(engine, "checkout", self._checkout)

    def _connect(self, *args: Any) -> None:
        self.connects += 1

    def _checkout(self, *args: Any) -> None:
        self.checkouts += 1


def kill_pooled_connection(engine: sa.Engine, observer: sa.Engine) -> int:
    """Check a connection into ``engine``'s pool, then end its backend from ``observer`` (as a
    server restart would) and wait until it is gone; its pid."""
    return terminate(backend_of(engine), observer)


def terminate(pid: int, observer: sa.Engine) -> int:
    """End backend ``pid`` from ``observer`` and wait until it is gone; ``pid``."""
    with observer.connect() as other:
        assert other.execute(sa.select(sa.func.pg_terminate_backend(pid))).scalar_one()

    def gone() -> bool:
        with observer.connect() as other:
            alive = other.execute(
                sa.text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}
            ).scalar_one()
        return alive == 0

    wait_for(gone)
    return pid


def backend_of(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        pid: int = conn.execute(sa.select(sa.func.pg_backend_pid())).scalar_one()
        return pid


def test_an_enqueue_with_an_engine_commits_its_own_transaction(
    engine: sa.Engine, queue: JobQueue
) -> None:
    job_id = queue.enqueue(engine, "work_a", {"n": 1}, priority=3)
    batch = queue.enqueue_many(engine, "work_b", [{"n": 2}, {"n": 3}])
    assert engine.pool.checkedout() == 0  # nothing left open: the transaction is over
    with engine.connect() as other:  # another connection sees the committed jobs
        rows = other.execute(sa.select(j.id, j.task, j.priority).order_by(j.id)).all()
    assert rows == [(job_id, "work_a", 3), (batch[0], "work_b", 0), (batch[1], "work_b", 0)]
    assert job_id.created


def test_a_dead_pooled_connection_is_replaced_and_the_job_added_once(
    plain_engine: sa.Engine, engine: sa.Engine, queue: JobQueue
) -> None:
    dead = kill_pooled_connection(plain_engine, engine)
    pool = Pool(plain_engine)
    job_id = queue.enqueue(plain_engine, "work_a", {"n": 1})
    assert pool.checkouts == 2  # the dead connection, then a new one
    assert pool.connects == 1
    assert backend_of(plain_engine) != dead
    with engine.connect() as other:
        ids = other.execute(sa.select(j.id)).scalars().all()
    assert ids == [job_id]

    kill_pooled_connection(plain_engine, engine)
    batch = queue.enqueue_many(plain_engine, "work_b", [{"n": 2}, {"n": 3}])
    assert count(engine) == 3
    assert len(set(batch)) == 2


def test_bad_input_raises_before_any_connection_is_taken(
    engine: sa.Engine, queue: JobQueue
) -> None:
    pool = Pool(engine)
    with pytest.raises(UnknownTaskError):
        queue.enqueue(engine, "no_such_task", {})
    with pytest.raises(PayloadError):
        queue.enqueue(engine, "work_a", {"a set": {1, 2}})
    with pytest.raises(InvalidScheduleError):
        queue.enqueue_many(engine, "work_a", [{}], lease=timedelta(0))
    with pytest.raises(TypeError, match="priorty"):
        queue.enqueue(engine, "work_a", {}, priorty=1)  # type: ignore[call-arg]
    assert pool.checkouts == 0
    assert count(engine) == 0


def test_an_async_engine_is_for_aenqueue(engine: sa.Engine, database_url: URL) -> None:
    queue = make_queue()

    async def scenario() -> None:
        async_engine = create_async_engine(database_url)
        try:
            with pytest.raises(TypeError, match="aenqueue"):
                queue.enqueue(async_engine, "work_a", {})  # type: ignore[arg-type]
            with pytest.raises(TypeError, match="aenqueue"):
                queue.enqueue(async_engine.sync_engine, "work_a", {})
        finally:
            await async_engine.dispose()

    asyncio.run(scenario())
    assert count(engine) == 0


def test_aenqueue_with_an_async_engine_commits_and_survives_a_dead_connection(
    engine: sa.Engine, database_url: URL
) -> None:
    queue = make_queue()

    async def scenario(async_engine: AsyncEngine) -> list[int]:
        first = await queue.aenqueue(async_engine, "work_a", {"n": 1})
        # The pooled connection dies under the next call (as when the server restarts).
        async with async_engine.connect() as conn:
            dead = (await conn.execute(sa.select(sa.func.pg_backend_pid()))).scalar_one()
        terminate(dead, engine)
        pool = Pool(async_engine.sync_engine)
        second = await queue.aenqueue(async_engine, "work_a", {"n": 2})
        assert pool.checkouts == 2  # the dead connection, then a new one
        batch = await queue.aenqueue_many(async_engine, "work_b", [{"n": 3}, {"n": 4}])
        async with async_engine.connect() as conn:
            pid = (await conn.execute(sa.select(sa.func.pg_backend_pid()))).scalar_one()
        assert pid != dead
        return [first, second, *batch]

    async def main() -> list[int]:
        async_engine = create_async_engine(database_url)
        try:
            return await scenario(async_engine)
        finally:
            await async_engine.dispose()

    ids = asyncio.run(main())
    with engine.connect() as other:
        assert other.execute(sa.select(j.id).order_by(j.id)).scalars().all() == ids


class Tagged(Middleware):
    """Tags each payload, and records the connection each enqueue was given."""

    def __init__(self) -> None:
        self.connections: list[sa.Connection] = []

    def enqueue(self, call: Enqueueing, proceed: ProceedEnqueue) -> list[Any]:
        self.connections.append(call.connection)
        tagged = [{**payload, "tag": "t"} for payload in call.payloads]
        return proceed(dataclasses.replace(call, payloads=tagged))


def test_middleware_runs_in_the_transaction_enqueue_began(
    plain_engine: sa.Engine, engine: sa.Engine
) -> None:
    tagged = Tagged()
    queue = make_queue(middleware=[tagged])
    kill_pooled_connection(plain_engine, engine)
    job_id = queue.enqueue(plain_engine, "work_a", {"n": 1})
    assert len(tagged.connections) == 2  # the dead connection's try, then the retry
    assert all(conn.closed for conn in tagged.connections)
    with engine.connect() as other:
        payloads = other.execute(sa.select(j.id, j.payload)).all()
    assert payloads == [(job_id, {"n": 1, "tag": "t"})]


class Bumping(Middleware):
    """Raises each enqueue's priority by one, writing into the call's options dict as it is."""

    def enqueue(self, call: Enqueueing, proceed: ProceedEnqueue) -> list[Any]:
        options = call.options
        assert isinstance(options, dict)
        options["priority"] = options.get("priority", 0) + 1
        return proceed(call)


def test_each_try_gives_the_middleware_the_call_as_enqueue_was_given_it(
    plain_engine: sa.Engine, engine: sa.Engine
) -> None:
    queue = make_queue(middleware=[Bumping()])
    kill_pooled_connection(plain_engine, engine)
    job_id = queue.enqueue(plain_engine, "work_a", {"n": 1}, priority=3)
    # Bumped once from what enqueue was given, not once more by the retry's middleware.
    with engine.connect() as other:
        assert other.execute(sa.select(j.priority).where(j.id == job_id)).scalar_one() == 4
