"""The Supervisor: N worker processes, restarted when they die, stopped together.

The parent does no job work: it starts each child (see ``_child``), waits on their
sentinels and a wake-up pipe, and decides. Its rules, in one place:

- **start method**: ``spawn``. A child is a fresh interpreter that builds its own engines
  and threads; nothing of the parent's (a pool, a lock held by a thread, the metrics server)
  is copied into it, which ``fork`` after threads or engines exist would do.
- **a crash** (any exit the supervisor did not ask for, other than a recycle) is followed by a
  new child after a backoff: 1 s, doubling up to 60 s, per child slot; a child that lived
  :data:`STABLE_AFTER` (60 s) resets its slot's backoff. Each crash is logged with its cause
  (the exit status or the signal) and how long the child lived.
- **a crash loop**: :data:`CRASH_LIMIT` crashes over all children within
  :data:`CRASH_WINDOW` end the supervisor: it stops the others and exits 1.
- **recycling**: a child that did its share exits :data:`~._child.EXIT_RECYCLED` after a
  graceful drain; a new one starts at once, and it is not a crash.
- **stop**: the first SIGTERM or SIGINT (or :meth:`Supervisor.stop`) sends SIGTERM to every
  child, which drains (its worker's ``shutdown_grace``); children still alive
  ``shutdown_grace`` + ``STOP_MARGIN`` + :data:`START_MARGIN` later are SIGKILLed, and the
  exit status is 1. A second SIGINT SIGKILLs them at once (status 130); a repeated SIGTERM
  changes nothing.
- **burst**: each child drains until it can start nothing more and exits 0; the supervisor
  exits 0 once every child has (a crashed child is replaced and drains too).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import Final

from sqlalchemy import Engine

from ..errors import JobQueueError, WorkerConfigError
from ._child import EXIT_RECYCLED, ChildOptions, WorkerFactory, child_main
from ._worker import STOP_MARGIN

log = logging.getLogger("sa_jobqueue.supervisor")

#: Backoff before restarting a crashed child: 1 s, doubled per crash in a row, at most 60 s.
FIRST_BACKOFF: Final = 1.0
MAX_BACKOFF: Final = 60.0
#: A child that lived this long (seconds) before it crashed starts its slot's backoff afresh.
STABLE_AFTER: Final = 60.0
#: This many crashes over all children within CRASH_WINDOW seconds: a crash loop, give up.
#: Five in a minute allows a bad deploy's first restarts (1 + 2 + 4 s of backoff) to fail
#: before the supervisor ends, so that the orchestrator above it sees the failure.
CRASH_LIMIT: Final = 5
CRASH_WINDOW: Final = 60.0
#: Time a child may take to start (import the app, connect) on top of its grace when stopped.
START_MARGIN: Final = 10.0
#: The supervisor's status when its children keep crashing or would not stop in time.
EXIT_FAILED: Final = 1


@dataclass
class _Slot:
    """One child's place: the process now in it, and its slot's crash history."""

    number: int
    process: BaseProcess | None = None
    started: float = 0.0
    crashes: int = 0  # in a row
    restart_at: float | None = None
    done: bool = False  # a burst child that drained


class Supervisor:
    """Runs ``processes`` worker processes, each with the Worker that ``make_worker`` builds.

    ``make_worker`` is called in each child (a fresh interpreter: the ``spawn`` start method)
    with the observers the supervisor needs there, and must pass them to its Worker::

        def make_worker(observers):
            return Worker(queue, create_engine(URL), observers=observers)

    It must be importable by its module and name (a function at module level, or a
    ``functools.partial`` of one), as multiprocessing pickles it; guard the script that starts
    the supervisor with ``if __name__ == "__main__"``. Children configure their own logging.

    :meth:`run` restarts a child that dies (with backoff, logging why), recycles one after
    ``max_jobs_per_child`` attempts or above ``max_memory_per_child`` MiB of resident memory,
    and returns the exit status (see :meth:`run`). ``shutdown_grace`` must be the workers'
    own: the supervisor waits that long for their drain (and 20 s more) before killing them.
    With ``metrics_port``, it serves every child's metrics on one endpoint (prometheus_client's
    multiprocess mode), and the queue gauges read through ``metrics_engine`` if given.

    What it does not promise: that a child's running jobs survive its crash (they are
    reclaimed when their leases expire), or that a child stays under ``max_memory_per_child``
    while a job runs (it is checked after each job).
    """

    def __init__(
        self,
        make_worker: WorkerFactory,
        *,
        processes: int = 2,
        burst: bool = False,
        max_jobs_per_child: int | None = None,
        max_memory_per_child: int | None = None,
        shutdown_grace: timedelta = timedelta(seconds=30),
        metrics_port: int | None = None,
        metrics_address: str = "0.0.0.0",
        metrics_engine: Engine | None = None,
        metrics_queues: Iterable[str] = (),
    ) -> None:
        if processes < 1:
            raise WorkerConfigError("processes must be at least 1")
        if max_jobs_per_child is not None and max_jobs_per_child < 1:
            raise WorkerConfigError("max_jobs_per_child must be at least 1")
        if max_memory_per_child is not None and max_memory_per_child < 1:
            raise WorkerConfigError("max_memory_per_child must be at least 1 (MiB)")
        self.processes = processes
        self.shutdown_grace = shutdown_grace
        self._make_worker = make_worker
        self._options = ChildOptions(
            burst=burst,
            max_jobs=max_jobs_per_child,
            max_memory=None if max_memory_per_child is None else max_memory_per_child * 2**20,
            metrics=metrics_port is not None,
        )
        self._metrics = (metrics_port, metrics_address, metrics_engine, list(metrics_queues))
        self._context = multiprocessing.get_context("spawn")
        self._slots = [_Slot(n) for n in range(1, processes + 1)]
        self._crashes: deque[float] = deque()
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        self._stop_signal: int | None = None  # set by the first stop
        self._kill_signal: int | None = None  # set by a second one
        self._status = 0
        self._metrics_dir: str | None = None
        self.metrics_server_port: int | None = None  # the port the endpoint listens on

    def stop(self, *, immediate: bool = False, signum: int = signal.SIGTERM) -> None:
        """Drain every child and return from :meth:`run`; ``immediate``: SIGKILL them now.

        Safe from a signal handler or another thread. A repeated SIGTERM changes nothing (a
        service manager may send one to every process of the group, and the supervisor gets
        it twice); a SIGINT once stopping (Ctrl-C again) is ``immediate``.
        """
        if self._stop_signal is None and not immediate:
            self._stop_signal = signum
        elif immediate or signum == signal.SIGINT:
            self._kill_signal = signum
        else:
            return
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_write, b"x")

    def run(self) -> int:
        """Run the children until stopped (or, in a burst, until all drained); the exit status.

        0: every child stopped cleanly (or drained, in a burst); 1 (:data:`EXIT_FAILED`): the
        children kept crashing, or one would not stop within its grace; 128 + N: a second
        signal N killed them. In the main thread, SIGTERM and SIGINT call :meth:`stop` while
        it runs.
        """
        with self._signals(), self._metrics_endpoint():
            for slot in self._slots:
                self._start(slot)
            self._loop()
        os.close(self._wake_read)
        os.close(self._wake_write)
        if self._kill_signal is not None:
            return 128 + self._kill_signal
        return self._status

    # -- the loop -------------------------------------------------------------------------------

    def _loop(self) -> None:
        deadline: float | None = None
        while True:
            if self._kill_signal is not None:
                self._kill_all("a second signal")
                return
            if self._stop_signal is not None and deadline is None:
                deadline = self._begin_stop()
            live = [s for s in self._slots if s.process is not None]
            if deadline is not None and not live:
                return
            if deadline is None and all(s.done for s in self._slots):
                log.info("every worker process drained its queues: exiting")
                return
            now = time.monotonic()
            due = [s.restart_at for s in self._slots if s.restart_at is not None]
            until = deadline if deadline is not None else min(due, default=None)
            timeout = None if until is None else max(0.0, until - now)
            waits = [s.process.sentinel for s in live if s.process is not None]
            multiprocessing.connection.wait([*waits, self._wake_read], timeout)
            with contextlib.suppress(BlockingIOError):
                os.read(self._wake_read, 64)
            for slot in live:
                assert slot.process is not None
                if not slot.process.is_alive():
                    self._ended(slot, stopping=deadline is not None)
            now = time.monotonic()
            if deadline is not None:
                if now >= deadline:
                    self._kill_all("they did not stop within their grace")
                    self._status = EXIT_FAILED
                    return
                continue
            if self._stop_signal is not None:
                continue  # giving up: start nothing more
            for slot in self._slots:
                if slot.restart_at is not None and slot.restart_at <= now:
                    self._start(slot)

    def _begin_stop(self) -> float:
        """Ask every child to drain; the time after which the stragglers are killed."""
        assert self._stop_signal is not None
        grace = self.shutdown_grace.total_seconds()
        log.info(
            "%s: asking %d worker process(es) to finish their running jobs (up to %gs)",
            "giving up" if self._status else signal.Signals(self._stop_signal).name,
            sum(s.process is not None for s in self._slots),
            grace,
        )
        for slot in self._slots:
            slot.restart_at = None
            if slot.process is not None and slot.process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.process.pid, signal.SIGTERM)
        return time.monotonic() + grace + STOP_MARGIN + START_MARGIN

    def _start(self, slot: _Slot) -> None:
        slot.restart_at = None
        process = self._context.Process(
            target=child_main,
            args=(self._make_worker, self._options),
            name=f"sa_jobqueue-worker-{slot.number}",
        )
        with _environment("PROMETHEUS_MULTIPROC_DIR", self._metrics_dir):
            process.start()
        slot.process, slot.started = process, time.monotonic()
        log.info("started worker process %d (pid %s)", slot.number, process.pid)

    def _ended(self, slot: _Slot, *, stopping: bool) -> None:
        """A child exited: decide between done, restart now, restart later, or give up."""
        process = slot.process
        assert process is not None
        assert process.pid is not None
        process.join()
        slot.process = None
        code = process.exitcode
        lived = time.monotonic() - slot.started
        self._forget_metrics(process.pid)
        name = f"worker process {slot.number} (pid {process.pid})"
        if stopping:
            if code in (0, EXIT_RECYCLED, -signal.SIGTERM):
                log.info("%s stopped", name)
            else:
                log.warning("%s stopped: it %s", name, _cause(code))
                self._status = EXIT_FAILED
            return
        if code == 0 and self._options.burst:
            log.info("%s drained its queues", name)
            slot.done = True
            return
        if code in (0, EXIT_RECYCLED):
            reason = "recycled itself" if code == EXIT_RECYCLED else "exited 0 unasked"
            log.info("%s %s after %.1fs: starting a new one", name, reason, lived)
            slot.crashes = 0
            slot.restart_at = time.monotonic()
            return
        if lived >= STABLE_AFTER:
            slot.crashes = 0
        slot.crashes += 1
        now = time.monotonic()
        self._crashes.append(now)
        while self._crashes and self._crashes[0] < now - CRASH_WINDOW:
            self._crashes.popleft()
        if len(self._crashes) >= CRASH_LIMIT:
            log.error(
                "%s %s after %.1fs; %d crashes within %gs: giving up",
                name,
                _cause(code),
                lived,
                len(self._crashes),
                CRASH_WINDOW,
            )
            self._status = EXIT_FAILED
            self.stop()
            return
        delay = min(MAX_BACKOFF, FIRST_BACKOFF * 2 ** (slot.crashes - 1))
        log.warning(
            "%s %s after %.1fs: starting a new one in %gs (crash %d in a row)",
            name,
            _cause(code),
            lived,
            delay,
            slot.crashes,
        )
        slot.restart_at = now + delay

    def _kill_all(self, why: str) -> None:
        for slot in self._slots:
            process = slot.process
            if process is not None and process.is_alive():
                log.warning("killing worker process %d (pid %s): %s", slot.number, process.pid, why)
                process.kill()
        for slot in self._slots:
            if slot.process is not None:
                slot.process.join()
                self._forget_metrics(slot.process.pid)
                slot.process = None

    # -- signals and metrics --------------------------------------------------------------------

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_signal(signum: int, frame: FrameType | None) -> None:
            self.stop(signum=signum)

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    @contextlib.contextmanager
    def _metrics_endpoint(self) -> Iterator[None]:
        port, address, engine, queues = self._metrics
        if port is None:
            yield
            return
        from ..observability._children_metrics import start_children_metrics_server

        self._metrics_dir = tempfile.mkdtemp(prefix="sa_jobqueue-metrics-")
        try:
            try:
                server = start_children_metrics_server(
                    self._metrics_dir, port, engine, addr=address, queues=queues
                )
            except OSError as exc:
                raise JobQueueError(f"cannot serve metrics on {address}:{port}: {exc}") from None
            self.metrics_server_port = server.port
            try:
                yield
            finally:
                server.close()
        finally:
            shutil.rmtree(self._metrics_dir, ignore_errors=True)
            self._metrics_dir = None

    def _forget_metrics(self, pid: int | None) -> None:
        """Tell prometheus_client that ``pid`` is gone (its live gauges stop counting)."""
        if self._metrics_dir is None or pid is None:
            return
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid, self._metrics_dir)  # type: ignore[no-untyped-call]


def _cause(code: int | None) -> str:
    """How a child ended, for a log line: "exited with status 1", "was killed by SIGKILL"."""
    if code is not None and code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


@contextlib.contextmanager
def _environment(name: str, value: str | None) -> Iterator[None]:
    """``name`` set to ``value`` in the environment a child starts with (nothing if None)."""
    if value is None:
        yield
        return
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before
