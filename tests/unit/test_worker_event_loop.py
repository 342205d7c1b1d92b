"""The event loop async handlers run on: starting coroutines from other threads, and the watch
that cancels handlers whose attempt should stop. No database: the async engine is never made."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest
from sqlalchemy.engine import URL

from sa_jobqueue import JobContext
from sa_jobqueue.errors import AttemptStoppedError
from sa_jobqueue.worker._event_loop import EventLoopThread, Slots


@pytest.fixture
def loop() -> Iterator[EventLoopThread]:
    thread = EventLoopThread(URL.create("postgresql+psycopg"), pool_size=1)
    yield thread
    thread.close()


def context() -> JobContext:
    return JobContext(
        job_id=1, task="t", queue="q", attempt=1, max_attempts=1, session=lambda: None
    )  # type: ignore[arg-type]


def run(loop: EventLoopThread, body: Callable[[], Coroutine[Any, Any, object]]) -> object:
    """Run ``body`` as a job's task on the loop (as the runner does); what it returned."""
    done = threading.Event()
    outcome: list[object] = []

    async def job() -> None:
        try:
            outcome.append(await body())
        except BaseException as exc:
            outcome.append(exc)
        finally:
            done.set()

    loop.start_soon(job(), loop.slots(1))
    assert done.wait(10)
    return outcome[0]


def test_coroutines_started_from_many_threads_all_run_once(loop: EventLoopThread) -> None:
    ran: list[int] = []
    all_ran = threading.Event()
    total = 4 * 250
    slots = loop.slots(16)

    async def job(n: int) -> None:
        ran.append(n)
        if len(ran) == total:
            all_ran.set()

    def starter(first: int) -> None:
        for n in range(first, first + 250):
            loop.start_soon(job(n), slots)

    threads = [threading.Thread(target=starter, args=(i * 250,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all_ran.wait(10)
    assert sorted(ran) == list(range(total))


def test_slots_run_at_most_their_size_at_once_in_the_order_started(
    loop: EventLoopThread,
) -> None:
    slots = loop.slots(3)
    started: list[int] = []
    running = 0
    most = 0
    all_done = threading.Event()

    async def job(n: int) -> None:
        nonlocal running, most
        started.append(n)
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.001)
        running -= 1
        if len(started) == 20 and running == 0:
            all_done.set()

    for n in range(20):
        loop.start_soon(job(n), slots)
    assert all_done.wait(10)
    assert started == list(range(20))
    assert most == 3


def test_a_handler_told_to_stop_is_cancelled_at_its_next_await(loop: EventLoopThread) -> None:
    ctx = context()
    seen: list[str] = []

    async def handler() -> None:
        try:
            ctx._stop = True  # as the heartbeat sets it (a timeout, a cancel, a lost lease)
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    async def body() -> object:
        try:
            await loop.supervised(handler(), ctx)
        except AttemptStoppedError as exc:
            # The cancellation was the handler's: the job's task goes on as usual.
            task = asyncio.current_task()
            assert task is not None
            assert task.cancelling() == 0
            await asyncio.sleep(0)
            return exc
        return None

    assert isinstance(run(loop, body), AttemptStoppedError)
    assert seen == ["cancelled"]


def test_a_handler_told_to_stop_before_it_starts_never_runs(loop: EventLoopThread) -> None:
    ctx = context()
    ctx._stop = True
    ran: list[bool] = []

    async def handler() -> None:
        ran.append(True)  # pragma: no cover - the test fails if reached

    async def body() -> object:
        return await loop.supervised(handler(), ctx)

    assert isinstance(run(loop, body), AttemptStoppedError)
    assert ran == []


def test_a_handler_that_catches_its_cancellation_and_returns_has_returned(
    loop: EventLoopThread,
) -> None:
    ctx = context()

    async def handler() -> str:
        ctx._stop = True
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(30)
        await asyncio.sleep(0)  # awaits again: the cancellation was delivered once only
        return "done anyway"

    async def body() -> object:
        value = await loop.supervised(handler(), ctx)
        task = asyncio.current_task()
        assert task is not None
        assert task.cancelling() == 0
        return value

    assert run(loop, body) == "done anyway"


def test_a_handlers_own_cancelled_error_fails_it_as_stopped(loop: EventLoopThread) -> None:
    async def handler() -> None:
        raise asyncio.CancelledError

    async def body() -> object:
        return await loop.supervised(handler(), context())

    assert isinstance(run(loop, body), AttemptStoppedError)


def test_a_handler_that_is_not_told_to_stop_runs_to_its_end(loop: EventLoopThread) -> None:
    async def handler() -> int:
        # Longer than a few of the watch's checks.
        await asyncio.sleep(0.2)
        return 7

    async def body() -> object:
        return await loop.supervised(handler(), context())

    assert run(loop, body) == 7


def test_slots_close_the_coroutines_that_never_started() -> None:
    spawned: list[Coroutine[Any, Any, None]] = []
    slots = Slots(1, spawned.append)  # a loop that never runs what it is given

    async def job() -> None:  # pragma: no cover - never runs
        pass

    waiting = [job(), job()]
    for coroutine in waiting:
        slots.add(coroutine)
    assert len(spawned) == 1  # one slot: one task for both
    spawned[0].close()
    slots.close()
    # Closed: no warning at collection that they were never awaited.
    assert [c.cr_frame for c in waiting] == [None, None]
