"""Hard time limits: an attempt run in a child process, killed when its limit is up.

A thread cannot be killed, so a task with a ``hard_timeout`` runs each attempt in a process
of its own (:func:`run_child`), started from the ``forkserver`` (a clean, single-threaded
process: never a fork of the worker's threads, locks and pooled connections). The child
connects with the worker's URL and pooler mode, runs the handler with a ``ctx.session`` of
its own, and, when the handler wrote through it, commits the fenced completion in the same
transaction, exactly as a job thread does. Its worker waits for its word on the job thread
(so the task's concurrency is counted as usual) and, at the limit, kills it (SIGKILL) and
terminates its server session, so that its open transaction is rolled back at once and its
row locks are freed, then records the attempt as failed with :class:`~sa_jobqueue.errors.
HardTimeoutError`, retried under the task's policy. A cancellation, or a lease lost, kills it
too. The worker's shutdown waits for a running attempt: a kill at the limit meanwhile is still
its failure, not a hand-back.

The child does not rely on its worker to die: it kills itself at the limit (plus
:data:`SELF_KILL_MARGIN`) even while its worker is stopped (SIGSTOP, a paused VM), and with
its worker (``PR_SET_PDEATHSIG`` on Linux). So an attempt never outlives its limit, and with a
limit shorter than the task's lease never outlives its lease: a job is not run twice at once,
and a queue's cap is strict for such tasks.

What is not promised: that the handler's effects outside ``ctx.session`` are undone, nor that
they happen once (a killed attempt is retried); the cost of a process start per attempt
(tens of milliseconds: hard limits are for long jobs, not for many short ones).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import datetime
from multiprocessing import forkserver
from multiprocessing.connection import Connection as Pipe
from typing import Any, Final, cast

from sqlalchemy import Engine, event
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from .._durations import duration_text
from .._error_text import RemoteError
from .._sql import session as session_sql
from ..database import as_pooler, create_engine, pooler_of
from ..errors import HardTimeoutError, UnstorableResultError
from ..middleware import run_chain
from ..queue import JobQueue
from ..tasks import Discard, JobContext, Retry, Task
from ._claimed import Claimed
from ._sessions import HandlerSession, decode, handler_session
from ._settlement import shutting_down
from ._successes import complete_in_transaction, encode_result

log = logging.getLogger("sa_jobqueue.worker")

#: How long after its limit a child kills itself if its worker has not (seconds): the worker
#: kills it at the limit, unless the worker is stopped or too busy to.
SELF_KILL_MARGIN: Final = 1.0
#: How long a child may take to start its handler before it is killed and its attempt
#: failed (seconds): a fork takes milliseconds, but a machine under heavy load may take
#: seconds, and a child that has not started runs nothing of the handler's.
START_BOUND: Final = 60.0
#: How often the waiting worker looks at the attempt's flags (cancelled, lease lost) while the
#: child runs (seconds).
LOOK_EVERY: Final = 0.1
#: Linux's prctl option: the signal a process gets when its parent dies.
_PR_SET_PDEATHSIG: Final = 1


@dataclass(frozen=True)
class ChildAttempt:
    """Everything a child needs to run one attempt (pickled to it)."""

    url: str
    pooler: str
    module: str
    qualname: str
    job_id: int
    task: str
    queue: str
    attempt: int
    max_attempts: int
    created_at: datetime | None
    priority: int
    payload: str  # the JSON text, as claimed
    keep_result: bool
    max_result_bytes: int
    limit: float  # seconds


@dataclass(frozen=True)
class ChildEnd:
    """How a child's attempt ended, as the worker records it.

    ``completed``: the child committed the fenced completion with the handler's writes
    (True), or its completion matched no row and it rolled them back (False); None when the
    handler wrote nothing (the worker completes the job) or failed. ``result``: a kept
    result's JSON text, for the worker to store. ``failure``: why the attempt failed.
    ``stopped``: the failure is the worker's shutdown's doing (the job is handed back, not
    failed): the child's handler never sees the shutdown, so only the worker's middleware,
    which runs in the worker around the child's attempt, can say so.
    """

    completed: bool | None = None
    result: str | None = None
    failure: BaseException | None = None
    stopped: bool = False


class Isolation:
    """Runs the attempts of hard-limited tasks in child processes; one per worker."""

    def __init__(self, queue: JobQueue, engine: Engine) -> None:
        self._url = engine.url.render_as_string(hide_password=False)
        self._pooler = pooler_of(engine)
        self._engine = engine  # to terminate a killed child's server session
        self._max_result_bytes = queue.max_payload_bytes
        self._middleware = queue.middleware
        self._context = multiprocessing.get_context("forkserver")
        # Each child is forked from the forkserver with the handlers' modules imported once.
        modules = sorted({t.handler.__module__ for t in queue.tasks.values() if t.hard_timeout})
        self._context.set_forkserver_preload(["sa_jobqueue.worker._isolation", *modules])
        # Started now, and waited for (its first child says it is up): the forkserver imports
        # the handlers' modules, which on a loaded machine takes seconds. Waited for at the
        # first attempt instead, that time would add to the attempt's, and to a shutdown that
        # waits for it.
        forkserver.ensure_running()
        ready = self._context.Process(target=_ready, name="sa-jobqueue forkserver check")
        ready.start()
        ready.join()

    def run(self, job: Claimed, task: Task, ctx: JobContext) -> ChildEnd:
        """Run ``job``'s attempt in a child and wait for it, killing it at the task's limit,
        or once ``ctx`` says the attempt was cancelled or lost its lease."""
        assert task.hard_timeout is not None
        limit = task.hard_timeout.total_seconds()
        spec = ChildAttempt(
            url=self._url,
            pooler=self._pooler,
            module=task.handler.__module__,
            qualname=task.handler.__qualname__,
            job_id=job.id,
            task=job.task,
            queue=job.queue,
            attempt=job.attempts,
            max_attempts=job.max_attempts,
            created_at=job.created_at,
            priority=job.priority,
            payload=job.payload,
            keep_result=task.keep_result,
            max_result_bytes=self._max_result_bytes,
            limit=limit,
        )
        ours, theirs = self._context.Pipe(duplex=False)
        child = self._context.Process(
            target=run_child, args=(spec, theirs), name=f"sa-jobqueue job {job.id}", daemon=True
        )
        # The limit counts from the handler's start, which the child says; its start-up (a
        # fork of the forkserver, with the handler's module imported: milliseconds on an idle
        # machine) gets up to START_BOUND.
        deadline = time.monotonic() + max(limit, START_BOUND)
        child.start()
        theirs.close()
        backend: int | None = None
        running = False
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._kill(child, backend)
                    if not running:
                        return ChildEnd(
                            failure=HardTimeoutError(
                                f"its process did not start within {START_BOUND:.0f}s"
                            )
                        )
                    return ChildEnd(
                        failure=HardTimeoutError(
                            f"killed at its hard time limit of {duration_text(task.hard_timeout)}"
                        )
                    )
                if ctx._stop or ctx._cancel:  # lost its lease, timed out, or cancelled
                    self._kill(child, backend)
                    return ChildEnd(completed=False)
                if not ours.poll(min(left, LOOK_EVERY)):
                    if not child.is_alive():
                        break
                    continue
                try:
                    kind, value = ours.recv()
                except EOFError:
                    break
                if kind == "started":
                    running = True
                    deadline = time.monotonic() + limit
                elif kind == "backend":
                    backend = value
                elif kind == "progress":  # the heartbeat writes it from this context
                    ctx._progress = value
                else:
                    end: ChildEnd = value
                    return end
            child.join(1)
            return ChildEnd(
                failure=HardTimeoutError(f"the attempt's process died ({_exit_text(child)})")
            )
        finally:
            ours.close()
            child.join(SELF_KILL_MARGIN)
            if child.is_alive():  # pragma: no cover - it said its last word and hangs
                child.kill()
                child.join()

    def attempt(self, job: Claimed, task: Task, payload: Any, ctx: JobContext) -> ChildEnd:
        """Run the attempt in a child, inside the queue's middleware (run here, in the
        worker, around the child's whole attempt); how it ended."""
        ends: list[ChildEnd] = []

        def in_child(ctx: JobContext, payload: Any) -> None:
            end = self.run(job, task, ctx)
            ends.append(end)
            if end.failure is not None:
                raise end.failure

        chain = run_chain(self._middleware, in_child) if self._middleware else in_child
        try:
            chain(ctx, payload)
        except Exception as exc:
            if ends and exc is ends[0].failure:
                return ends[0]
            # The middleware's own, or changed by it: the middleware runs here, and may have
            # stopped part-way because the worker is shutting down.
            return ChildEnd(failure=exc, stopped=shutting_down(ctx))
        if not ends:  # the middleware did not proceed: the attempt succeeded without running
            return ChildEnd()
        end = ends[0]
        if end.failure is not None:  # a middleware swallowed it: the attempt succeeded
            return ChildEnd()
        return end

    def _kill(self, child: multiprocessing.process.BaseProcess, backend: int | None) -> None:
        child.kill()
        child.join(SELF_KILL_MARGIN)
        if backend is None:
            return
        # Its transaction is over once the server notices the connection is gone, which it
        # may not until a long statement ends: terminate it now, so its locks go with it.
        try:
            with self._engine.connect() as conn:
                conn.execute(session_sql.terminate_backend(), {"pid": backend})
        except SQLAlchemyError as exc:
            log.warning("could not end the server session of a killed attempt: %s", exc)


def _ready() -> None:
    """The forkserver's first child: it does nothing; that it started says the server is up."""


def _exit_text(child: multiprocessing.process.BaseProcess) -> str:
    code = child.exitcode
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


def child_session() -> Session:
    """``ctx.session`` in the worker, for a hard-limited task's middleware: refused."""
    raise RuntimeError(
        "a task with a hard_timeout runs its attempts in a child process, whose ctx.session"
        " is the handler's: middleware cannot write through it in the worker"
    )


# -- in the child --------------------------------------------------------------------------


def run_child(spec: ChildAttempt, pipe: Pipe) -> None:
    """The child's whole life: run the attempt, say how it ended, exit."""
    _die_with_parent()
    watchdog = threading.Timer(spec.limit + SELF_KILL_MARGIN, _kill_self)
    watchdog.daemon = True
    watchdog.start()
    pipe.send(("started", None))
    engine = create_engine(
        spec.url,
        pooler=as_pooler(spec.pooler),
        poolclass=NullPool,
        connect_args={"application_name": f"sa-jobqueue attempt {spec.job_id}"},
    )

    @event.listens_for(engine, "connect")
    def said_backend(dbapi_connection: Any, record: Any) -> None:
        pipe.send(("backend", int(dbapi_connection.info.backend_pid)))

    try:
        pipe.send(("end", _attempt(spec, engine, pipe)))
    finally:
        engine.dispose()
        pipe.close()


def _attempt(spec: ChildAttempt, engine: Engine, pipe: Pipe) -> ChildEnd:
    until = time.monotonic() + spec.limit
    ctx = JobContext(
        job_id=spec.job_id,
        task=spec.task,
        queue=spec.queue,
        attempt=spec.attempt,
        max_attempts=spec.max_attempts,
        created_at=spec.created_at,
        priority=spec.priority,
        session=functools.partial(handler_session, engine, until),
    )
    # Each report goes to the worker, whose heartbeat writes the latest: a write to the pipe
    # (microseconds), never a statement.
    ctx._forward_progress = functools.partial(_forward, pipe)
    try:
        task = _handler_task(spec)
        payload = decode(spec.payload)
        if task.payload_codec is not None:
            payload = task.payload_codec.rebuild(payload)
        value = task.handler(ctx, payload)
        result = encode_result(task, value, spec.max_result_bytes)
        session = cast(HandlerSession, ctx.session) if ctx.session_used else None
        if session is None or not session.in_transaction():
            return ChildEnd(result=result)
        session.flush()
        return ChildEnd(completed=_complete(session, spec, result))
    except UnstorableResultError as exc:
        _roll_back(ctx)
        return ChildEnd(failure=exc)
    except Exception as exc:
        _roll_back(ctx)
        return ChildEnd(failure=_portable(exc))


#: A handler may report from threads of its own: one message in the pipe at a time.
_SENDING: Final = threading.Lock()


def _forward(pipe: Pipe, report: Any) -> None:
    with _SENDING, contextlib.suppress(OSError):  # a worker gone: the child dies with it
        pipe.send(("progress", report))


def _roll_back(ctx: JobContext) -> None:
    if ctx.session_used:
        with contextlib.suppress(Exception):
            ctx.session.rollback()


def _complete(session: HandlerSession, spec: ChildAttempt, result: str | None) -> bool:
    """The fenced completion in the handler's transaction, committed with its writes, or
    (none matched) rolled back with them."""
    done = complete_in_transaction(session, spec.job_id, spec.attempt, result)
    if not done:
        session.rollback()
    return done


def _handler_task(spec: ChildAttempt) -> Task:
    """The task whose handler the child runs, found by the handler's module and name: the
    module's attribute is the Task (a decorated function) or the function itself."""
    found: Any = importlib.import_module(spec.module)
    for part in spec.qualname.split("."):
        found = getattr(found, part)
    if isinstance(found, Task):
        return found
    return Task(name=spec.task, handler=found, keep_result=spec.keep_result)


def _portable(exc: Exception) -> BaseException:
    """The handler's exception, as it can cross to the worker: Retry and Discard as they
    are (their arguments rebuilt), anything else as a RemoteError with its type, message and
    traceback, so that ``last_error`` reads as if it had been raised in the worker."""
    if isinstance(exc, Retry):
        return Retry(exc.after, exc.reason)
    if isinstance(exc, Discard):
        return Discard(exc.reason)
    kind = type(exc)
    try:
        message = str(exc)
    except Exception:
        message = f"<unprintable {kind.__name__}>"
    return RemoteError(
        f"{kind.__module__}.{kind.__qualname__}",
        message,
        "".join(traceback.format_exception(exc)),
    )


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _die_with_parent() -> None:
    """Linux: have the kernel kill this process when its worker dies, whatever kills it."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the worker died before the line above
        _kill_self()
