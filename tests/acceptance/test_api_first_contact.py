"""The Python API as a new user first meets it: mistakes refused early, with our own errors.

A handler that cannot be called as ``handler(ctx, payload)`` is refused where it is declared,
not at its first run in a worker. ``enqueue`` given something that is not a task, or a session
that belongs to asyncio, raises TypeError pointing at what to do, before any SQL is sent and
without SQLAlchemy's internals in the way. And ``list_jobs`` pages newest first as well.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from sa_jobqueue import (
    JobQueue,
)
from sa_jobqueue.models import jobs_table
from tests.helpers.jobs import count, handler

j = jobs_table.c


# -- handler signatures ---------------------------------------------------------------------------


# -- enqueue given something that is not a task -------------------------------------------------


@pytest.fixture
def queue() -> JobQueue:
    queue = JobQueue()
    queue.task(name="send", queue="emails")(handler)
    return queue


def test_aenqueue_of_something_that_is_not_a_task_is_a_type_error(queue: JobQueue) -> None:
    async def scenario() -> None:
        with pytest.raises(TypeError):
            await queue.aenqueue(None, print, {})  # type: ignore[arg-type]

    asyncio.run(scenario())


# -- enqueue given a session of the asyncio world -------------------------------------------------


@pytest.fixture
def on_async_engine(database_url: URL) -> Callable[..., Any]:
    """``on_async_engine(scenario)``: asyncio.run a coroutine function given an AsyncEngine."""

    def runner(scenario: Callable[[AsyncEngine], Any]) -> Any:
        async def main() -> Any:
            async_engine = create_async_engine(database_url)
            try:
                return await scenario(async_engine)
            finally:
                await async_engine.dispose()

        return asyncio.run(main())

    return runner


def assert_points_at_aenqueue(exc: BaseException) -> None:
    assert type(exc) is TypeError
    assert "aenqueue" in str(exc)


def test_enqueue_on_a_session_bound_to_an_async_engine(
    engine: sa.Engine, queue: JobQueue, on_async_engine: Callable[..., Any]
) -> None:
    async def scenario(async_engine: AsyncEngine) -> None:
        for bind in (async_engine, async_engine.sync_engine):
            with Session(bind) as session:
                with pytest.raises(TypeError) as refused:
                    queue.enqueue(session, "send", {})
                assert_points_at_aenqueue(refused.value)
                with pytest.raises(TypeError) as refused:
                    queue.enqueue_many(session, "send", [{}])
                assert_points_at_aenqueue(refused.value)

    on_async_engine(scenario)
    assert count(engine) == 0


def test_enqueue_on_an_async_session_or_connection(
    engine: sa.Engine, queue: JobQueue, on_async_engine: Callable[..., Any]
) -> None:
    async def scenario(async_engine: AsyncEngine) -> None:
        async with AsyncSession(async_engine) as session:
            with pytest.raises(TypeError) as refused:
                queue.enqueue(session, "send", {})  # type: ignore[arg-type]
            assert_points_at_aenqueue(refused.value)
        async with async_engine.connect() as conn:
            with pytest.raises(TypeError) as refused:
                queue.enqueue(conn, "send", {})  # type: ignore[arg-type]
            assert_points_at_aenqueue(refused.value)

    on_async_engine(scenario)
    assert count(engine) == 0


def test_enqueue_inside_run_sync_still_works(
    engine: sa.Engine, queue: JobQueue, on_async_engine: Callable[..., Any]
) -> None:
    async def scenario(async_engine: AsyncEngine) -> None:
        async with AsyncSession(async_engine) as session, session.begin():
            await session.run_sync(lambda sync: queue.enqueue(sync, "send", {}))

    on_async_engine(scenario)
    assert count(engine) == 1


# -- list_jobs, newest first ----------------------------------------------------------------------
