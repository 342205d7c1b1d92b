"""A worker inside an application: its engines built from a URL, and its run on an event loop.

``Worker.from_url`` builds the two engines the way ``sa-jobqueue worker`` does (the command
calls it, so there is one way): a handler engine with a connection per job thread, and a
control engine for the worker's own statements (:func:`sa_jobqueue.database.create_control_engine`).
``Worker.arun`` runs the blocking :meth:`Worker.run` on a thread of its own and awaits it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, TypedDict

from sqlalchemy import Engine
from sqlalchemy.engine import URL

from ..database import Pooler, create_control_engine, create_engine
from ..observability import Observer

if TYPE_CHECKING:
    from ._worker import Worker

#: Job threads a worker runs when told nothing else.
CONCURRENCY = 10


class WorkerOptions(TypedDict, total=False):
    """The keywords :meth:`Worker.from_url` passes on to :class:`Worker` (see its docstring)."""

    concurrency: int
    queues: Iterable[str] | Mapping[str, int] | None
    poll_interval: timedelta
    shutdown_grace: timedelta
    listen: bool
    name: str | None
    prefetch: int | None
    retention: timedelta | None
    observers: Sequence[Observer]


#: Connections the handler engine may open beyond one per job thread: a handler that opens a
#: second session, the listener's connection, the pruner.
HANDLER_OVERFLOW = 2


def engines_for(url: str | URL, options: WorkerOptions, pooler: Pooler) -> tuple[Engine, Engine]:
    """The handler engine and the control engine of a worker with these options."""
    queues = options.get("queues")
    concurrency = options.get("concurrency", CONCURRENCY)
    threads = sum(queues.values()) if isinstance(queues, Mapping) else concurrency
    # One connection per handler thread; the worker's own statements use a second engine.
    engine = create_engine(url, pooler=pooler, pool_size=threads, max_overflow=HANDLER_OVERFLOW)
    control = create_control_engine(url, threads, pooler=pooler)
    return engine, control


async def run_on_loop(worker: Worker, burst: bool) -> bool:
    """Run ``worker`` on a thread of its own; on cancellation, stop it and wait for the stop.

    The thread is a daemon: a process that exits while a handler still runs past its grace
    does not wait for it (its job is reclaimed once its lease expires), as the CLI does not.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[bool] = loop.create_future()

    def settle(result: bool | None, error: BaseException | None) -> None:
        if done.cancelled():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(bool(result))

    def target() -> None:
        result, error = None, None
        try:
            result = worker.run(burst=burst)
        except BaseException as exc:  # handed to the awaiting task, raised there
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: no one awaits
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=target, name="sa_jobqueue-worker", daemon=True).start()
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        # Cancelled (an application shutting down): the graceful stop, as SIGTERM asks the
        # CLI's worker, within its shutdown grace and STOP_MARGIN; then the cancellation goes on.
        worker.stop()
        with contextlib.suppress(Exception):
            await asyncio.shield(done)
        raise
