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
    InvalidJobError,
    InvalidNameError,
    JobQueue,
)
from sa_jobqueue.models import jobs_table
from tests.helpers.job_states import add_dead, add_job
from tests.helpers.jobs import count, handler

j = jobs_table.c


# -- handler signatures ---------------------------------------------------------------------------


# -- enqueue given something that is not a task -------------------------------------------------


@pytest.fixture
def queue() -> JobQueue:
    queue = JobQueue()
    queue.task(name="send", queue="emails")(handler)
    return queue


@pytest.mark.parametrize("task", [print, handler, JobQueue], ids=["print", "handler", "class"])
def test_enqueue_of_something_that_is_not_a_task_is_a_type_error(
    engine: sa.Engine, queue: JobQueue, task: Any
) -> None:
    with Session(engine) as session, session.begin():
        for call in (
            lambda: queue.enqueue(session, task, {}),
            lambda: queue.enqueue_many(session, task, [{}]),
        ):
            with pytest.raises(TypeError) as refused:
                call()
            assert not isinstance(refused.value, InvalidJobError)
            message = str(refused.value)
            assert "Task" in message
            assert "name" in message
        if task is handler:
            assert "'send'" in message  # the handler of a registered task: say which
        queue.enqueue(session, "send", {})  # the transaction is still usable
    assert count(engine) == 1


def test_a_task_name_of_the_wrong_type_is_still_a_bad_name(
    engine: sa.Engine, queue: JobQueue
) -> None:
    with Session(engine) as session, pytest.raises(InvalidNameError):
        queue.enqueue(session, 42, {})  # type: ignore[arg-type]


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


def test_list_jobs_newest_first_pages_by_id(engine: sa.Engine, queue: JobQueue) -> None:
    with engine.begin() as conn:
        dead = [add_dead(conn, queue="mail", task="send") for _ in range(5)]
        other = add_dead(conn, queue="mail", task="bounce")
        live = add_job(conn, queue="mail", task="send")

    with engine.connect() as conn:
        everything = queue.list_jobs(conn, newest_first=True)
        assert [job.id for job in everything] == [live, other, *reversed(dead)]
        first = queue.list_jobs(conn, task="send", status="dead", limit=2, newest_first=True)
        assert [job.id for job in first] == [dead[4], dead[3]]
        rest = queue.list_jobs(
            conn, task="send", status="dead", after_id=first[-1].id, newest_first=True
        )
        assert [job.id for job in rest] == [dead[2], dead[1], dead[0]]
        # The same cursor read oldest first goes the other way from it.
        later = queue.list_jobs(conn, task="send", status="dead", after_id=first[-1].id)
        assert [job.id for job in later] == [dead[4]]
