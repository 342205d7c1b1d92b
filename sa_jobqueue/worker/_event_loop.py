"""The event loop ``async def`` handlers run on, and the watch that stops them."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Awaitable, Coroutine
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import URL

from ..database import CONNECT_ARGS, Pooler
from ..tasks import JobContext

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

#: How often an async handler's stop flag is checked (seconds).
ASYNC_STOP_CHECK = 0.05


class AttemptStopped(Exception):
    """The worker cancelled an async handler (timeout, cancellation or lost lease)."""


# last_error keeps the failure's type as "module.name", and users search jobs by it: keep the
# name this error has always been stored under, from before the worker became a package.
AttemptStopped.__module__ = "sa_jobqueue.execution"


async def supervised(coroutine: Awaitable[object], ctx: JobContext) -> object:
    """Await an ``async def`` handler's coroutine, cancelling it once it should stop; what it
    returned.

    Unlike a sync handler, it is really stopped: once ``ctx.stop_requested`` turns True
    (timeout, cancellation, lost lease) it is cancelled at its next ``await``, and
    :class:`AttemptStopped` is raised in its place. A shutdown only asks: the handler sees
    ``ctx.stop_requested`` and has the shutdown grace to end by itself.
    """
    job = asyncio.ensure_future(coroutine)
    while not job.done():
        if ctx._stop:
            job.cancel()
            break
        await asyncio.wait({job}, timeout=ASYNC_STOP_CHECK)
    try:
        return await job
    except asyncio.CancelledError:
        raise AttemptStopped("the worker cancelled this attempt") from None


class EventLoopThread:
    """The worker's event loop, on a thread of its own, where ``async def`` handlers run.

    Made only for a queue with async handlers. Their sessions come from an async engine on
    the worker's database URL, made on first use; :meth:`close` disposes of it.
    """

    def __init__(self, url: URL, pool_size: int, pooler: Pooler = "session") -> None:
        self._url = url
        self._pool_size = pool_size
        self._pooler = pooler
        self._engine: AsyncEngine | None = None
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

    def submit(self, coroutine: Coroutine[Any, Any, None]) -> concurrent.futures.Future[None]:
        """Schedule a coroutine on the loop from any thread; its future says when it is done."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def close(self) -> None:
        """Dispose of the async engine and stop the loop (its unfinished tasks are dropped)."""
        if self._engine is not None:
            with contextlib.suppress(Exception):
                self.submit(self._engine.dispose()).result(timeout=5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self.loop.close()
