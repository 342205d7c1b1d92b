"""The event loop ``async def`` handlers run on, and the watch that stops them."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import URL

from ..database import CONNECT_ARGS, Pooler
from ..errors import AttemptStoppedError
from ..tasks import JobContext

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

log = logging.getLogger("sa_jobqueue.worker")

#: How often an async handler's stop flag is checked (seconds).
ASYNC_STOP_CHECK = 0.05


class Slots:
    """Runs coroutines on the event loop, at most ``size`` at once, in the order they came.

    Each runs in one of up to ``size`` tasks, which takes the next waiting coroutine as soon
    as its own ends, in the same step of the loop: no task is made, and none woken, for each
    coroutine (a semaphore would wake a waiting task for each, a step later, and each such
    step of the loop may hand the GIL to another thread). A task ends once nothing waits.
    Made and used on the loop's thread only (see :meth:`EventLoopThread.start_soon`).
    """

    __slots__ = ("_running", "_spawn", "_waiting", "size")

    def __init__(self, size: int, spawn: Callable[[Coroutine[Any, Any, None]], None]) -> None:
        self.size = size
        self._spawn = spawn
        self._waiting: collections.deque[Coroutine[Any, Any, None]] = collections.deque()
        self._running = 0

    def add(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Run ``coroutine`` once fewer than ``size`` others run."""
        self._waiting.append(coroutine)
        if self._running < self.size:
            self._running += 1
            self._spawn(self._run())

    async def _run(self) -> None:
        try:
            while self._waiting:
                try:
                    await self._waiting.popleft()
                except Exception:  # pragma: no cover - a bug of ours; the others still run
                    log.exception("an async job's attempt failed unexpectedly")
        finally:
            self._running -= 1

    def close(self) -> None:
        """Close the coroutines still waiting (after the loop stopped): never started."""
        while self._waiting:
            self._waiting.popleft().close()


class EventLoopThread:
    """The worker's event loop, on a thread of its own, where ``async def`` handlers run.

    Made only for a queue with async handlers. Their sessions come from an async engine on
    the worker's database URL, made on first use; :meth:`close` disposes of it.

    What a job costs the loop is no task of its own: coroutines started from other threads
    wake the loop once for as many as arrive before it wakes (:meth:`start_soon`), run in
    long-lived tasks, a set of :class:`Slots` each, and one watch on a timer, not one per
    handler, cancels the handlers that should stop (:meth:`supervised`).
    """

    def __init__(self, url: URL, pool_size: int, pooler: Pooler = "session") -> None:
        self._url = url
        self._pool_size = pool_size
        self._pooler = pooler
        self._engine: AsyncEngine | None = None
        # Coroutines on their way to the loop, and whether the loop has been woken for them.
        self._incoming_lock = threading.Lock()
        self._incoming: list[tuple[Coroutine[Any, Any, None], Slots]] = []
        self._slots: list[Slots] = []
        # The loop's own (touched on its thread only): the tasks it runs, which asyncio holds
        # only weakly; the handlers watched, and those cancelled by the watch.
        self._tasks: set[asyncio.Task[None]] = set()
        self._watched: dict[asyncio.Task[Any], JobContext] = {}
        self._cancelled: set[asyncio.Task[Any]] = set()
        self._watch: asyncio.TimerHandle | None = None
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="sa_jobqueue-event-loop", daemon=True
        )
        self._thread.start()

    def engine(self) -> AsyncEngine:
        """The async engine for handlers' sessions (call on the loop's thread)."""
        if self._engine is None:
            try:
                from sqlalchemy.ext.asyncio import create_async_engine
            except ImportError as exc:  # SQLAlchemy's asyncio extension needs greenlet
                raise RuntimeError(
                    "ctx.async_session needs SQLAlchemy's asyncio extension:"
                    " pip install 'sa_jobqueue[asyncio]'"
                ) from exc
            self._engine = create_async_engine(
                self._url,
                connect_args=(
                    # No prepared statements where the next transaction may land elsewhere.
                    {**CONNECT_ARGS, "prepare_threshold": None}
                    if self._pooler == "transaction"
                    else dict(CONNECT_ARGS)
                ),
                pool_size=self._pool_size,
                pool_pre_ping=True,
            )
        return self._engine

    def slots(self, size: int) -> Slots:
        """A set of ``size`` slots to start coroutines in (see :meth:`start_soon`)."""
        slots = Slots(size, self._spawn)
        self._slots.append(slots)
        return slots

    def start_soon(self, coroutine: Coroutine[Any, Any, None], slots: Slots) -> None:
        """Run a coroutine on the loop in one of ``slots``, from any thread; nothing says when
        it is done (the coroutine says so itself).

        The first of a burst wakes the loop (a write to its self-pipe, taken by the loop in
        turn); those that arrive before the loop has woken join it, so a claim of many jobs
        costs the claim loop and the event loop one hand-off, not one per job.
        """
        with self._incoming_lock:
            self._incoming.append((coroutine, slots))
            first = len(self._incoming) == 1
        if first:
            self.loop.call_soon_threadsafe(self._start_incoming)

    def submit(self, coroutine: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        """Run a coroutine on the loop, outside any slot, from a thread that waits for its
        future (a batch task's job thread: its batch is formed and settled there)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def _start_incoming(self) -> None:
        with self._incoming_lock:
            incoming, self._incoming = self._incoming, []
        for coroutine, slots in incoming:
            slots.add(coroutine)

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = self.loop.create_task(coroutine)
        self._tasks.add(task)  # asyncio keeps only a weak reference
        task.add_done_callback(self._tasks.discard)

    async def supervised(self, coroutine: Awaitable[object], ctx: JobContext) -> object:
        """Await an ``async def`` handler's coroutine in the calling task, cancelling it once
        it should stop; what it returned.

        Unlike a sync handler, it is really stopped: once ``ctx.stop_requested`` turns True
        (timeout, cancellation, lost lease) it is cancelled at its next ``await``, within
        ``ASYNC_STOP_CHECK`` seconds, and :class:`AttemptStoppedError` is raised in its place; so
        is it for a ``CancelledError`` of the handler's own. A shutdown only asks: the
        handler sees ``ctx.stop_requested`` and has the shutdown grace to end by itself. A
        handler that catches the cancellation and returns has returned.
        """
        if ctx._stop:  # stopped before it started: it does not start
            if inspect.iscoroutine(coroutine):
                coroutine.close()
            raise AttemptStoppedError("the worker cancelled this attempt")
        task = asyncio.current_task()
        assert task is not None  # called from a task: the job's
        self._watched[task] = ctx
        if self._watch is None:
            self._watch = self.loop.call_later(ASYNC_STOP_CHECK, self._check_stops)
        try:
            return await coroutine
        except asyncio.CancelledError:
            raise AttemptStoppedError("the worker cancelled this attempt") from None
        finally:
            del self._watched[task]
            if task in self._cancelled:
                # The cancellation was for the handler, which is over: what the task does
                # next (settle the attempt) must not see it.
                self._cancelled.discard(task)
                task.uncancel()

    def _check_stops(self) -> None:
        """The watch: cancel the handlers whose attempt should stop; again in a while, for as
        long as handlers run.

        It runs between the loop's steps, so every handler watched is suspended at an
        ``await`` of its own, where the cancellation lands.
        """
        for task, ctx in self._watched.items():
            if ctx._stop and task not in self._cancelled:
                self._cancelled.add(task)
                task.cancel()
        self._watch = (
            self.loop.call_later(ASYNC_STOP_CHECK, self._check_stops) if self._watched else None
        )

    def close(self) -> None:
        """Dispose of the async engine and stop the loop (its unfinished tasks are dropped)."""
        if self._engine is not None:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._engine.dispose(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if self._thread.is_alive():
            return
        self.loop.close()
        # Never started: closed, so that no warning says they were never awaited.
        with self._incoming_lock:
            incoming, self._incoming = self._incoming, []
        for coroutine, _ in incoming:
            coroutine.close()
        for slots in self._slots:
            slots.close()
