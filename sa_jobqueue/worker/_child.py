"""One supervised worker process: its signals, its recycling, its exit status.

A :class:`~sa_jobqueue.worker.Supervisor` starts :func:`child_main` in each child (a fresh
interpreter: the ``spawn`` start method). The child builds its worker with the user's
factory, and runs it until the supervisor asks it to stop, its parent dies, or it has done
its share (``max_jobs_per_child``, ``max_memory_per_child``): then it drains like a worker
given SIGTERM and exits :data:`EXIT_RECYCLED`, which the supervisor does not count as a crash.

Signals: SIGTERM starts the graceful drain (a repeated SIGTERM changes nothing; the
supervisor SIGKILLs a child that outlives its grace). SIGINT is ignored: the supervisor
decides for its children. Each child runs in a session of its own (see :func:`child_main`),
so a terminal's Ctrl-C reaches only the supervisor, which forwards the stop.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import resource
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from sqlalchemy.exc import SQLAlchemyError

from .._error_text import one_line
from ..errors import JobQueueError
from ..observability import JobRun, Observer
from ._signals import exit_by, relayed
from ._worker import Worker

log = logging.getLogger("sa_jobqueue.worker")

#: A child that recycled itself (after its jobs or above its memory) exits with this status:
#: 75 is EX_TEMPFAIL of sysexits.h, "try again". The supervisor starts a fresh child at once.
EXIT_RECYCLED: Final = 75
#: A child whose worker could not stop cleanly (jobs still running past the grace) exits 1,
#: like ``sa-jobqueue worker``; other statuses are the worker's own or a signal's.
EXIT_UNCLEAN: Final = 1

#: Builds the child's worker; it must pass the observers it is given to the Worker.
WorkerFactory = Callable[[Sequence[Observer]], Worker]

# The page size, to turn /proc/self/statm's pages into bytes.
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True, slots=True)
class ChildOptions:
    """What the supervisor tells each child (pickled to it)."""

    burst: bool = False
    max_jobs: int | None = None
    max_memory: int | None = None  # bytes
    metrics: bool = False


def resident_bytes() -> int:
    """This process's resident memory now (Linux), or its peak where /proc is missing."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except OSError:  # not Linux: the peak, which getrusage gives in KiB (bytes on macOS)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


class Recycler(Observer):
    """Stops the worker once it has finished ``max_jobs`` attempts or uses ``max_memory``.

    Checked after each attempt's outcome is recorded (a hand-back is not counted), on the
    worker's own thread; the stop is the graceful one, so running jobs finish. What it does
    not promise: exactly ``max_jobs`` (jobs already claimed finish too), or a bound on memory
    during a job (a job that grows past it is only noticed once it is done).
    """

    def __init__(self, max_jobs: int | None, max_memory: int | None) -> None:
        self.max_jobs = max_jobs
        self.max_memory = max_memory
        self.reason: str | None = None  # why it stopped the worker, once it has
        self._stop: Callable[[], None] = lambda: None
        self._done = 0
        self._lock = threading.Lock()

    def attach(self, stop: Callable[[], None]) -> None:
        """Call ``stop`` (the worker's) when the child has done its share."""
        self._stop = stop

    def finished(
        self, job: JobRun, outcome: str, run_time: float | None, error: BaseException | None
    ) -> None:
        if outcome == "handed_back":
            return
        with self._lock:
            self._done += 1
            if self.reason is not None:
                return
            if self.max_jobs is not None and self._done >= self.max_jobs:
                self.reason = f"it has run {self._done} jobs (--max-jobs-per-child)"
            elif self.max_memory is not None:
                used = resident_bytes()
                if used > self.max_memory:
                    self.reason = (
                        f"it uses {used / 2**20:.0f} MiB of memory (--max-memory-per-child"
                        f" {self.max_memory / 2**20:.0f})"
                    )
            if self.reason is None:
                return
        log.info("recycling this worker process: %s", self.reason)
        self._stop()


def child_main(make_worker: WorkerFactory, options: ChildOptions) -> None:
    """Build the worker, run it, and exit with the status the supervisor reads."""
    # A session of its own, as a separately started worker has: Linux's autogroup scheduler
    # shares the CPU between sessions first, so children in the supervisor's one session
    # got one share between them against the database and other work on the machine (a
    # writing drain of 2 children ran at 0.68x two workers). The supervisor still stops
    # them (it signals each pid), and each still stops with it (_stop_with_parent).
    with contextlib.suppress(OSError):
        os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stopping = threading.Event()
    worker: Worker | None = None

    def on_term(signum: int) -> None:
        stopping.set()
        if worker is not None:
            exit_by(worker._stop_seconds)
            worker.stop()

    with relayed((signal.SIGTERM,), on_term):
        observers: list[Observer] = []
        recycler = None
        if options.max_jobs is not None or options.max_memory is not None:
            recycler = Recycler(options.max_jobs, options.max_memory)
            observers.append(recycler)
        if options.metrics:
            # The supervisor set PROMETHEUS_MULTIPROC_DIR before starting this process: these
            # counters live in files there, which the supervisor's endpoint adds up.
            from ..observability.metrics import PrometheusObserver

            observers.append(PrometheusObserver())
        try:
            worker = make_worker(observers)
            given = worker._observe.observers
            if any(observer not in given for observer in observers):
                raise TypeError(
                    "the worker factory must pass the observers it is given to the Worker"
                )
            if recycler is not None:
                recycler.attach(worker.stop)
            _stop_with_parent(worker)
            if stopping.is_set():  # SIGTERM came while the worker was being built
                worker.stop()
            clean = worker.run(burst=options.burst)
        except (JobQueueError, SQLAlchemyError) as exc:
            # What the user can fix (the database, the schema, the app): one line, as the command.
            log.error("worker process cannot run: %s", one_line(exc))
            logging.shutdown()
            sys.exit(EXIT_UNCLEAN)
    logging.shutdown()
    if not clean:
        os._exit(EXIT_UNCLEAN)  # handler threads still running cannot be joined; do not wait
    sys.exit(EXIT_RECYCLED if recycler is not None and recycler.reason else 0)


def _stop_with_parent(worker: Worker) -> None:
    """Stop the worker gracefully if the supervisor dies (its sentinel becomes ready)."""
    parent = multiprocessing.parent_process()
    if parent is None:  # not started by multiprocessing: nobody to watch
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        log.warning("the supervisor is gone: stopping this worker process")
        worker.stop()

    threading.Thread(target=watch, name="sa_jobqueue-parent-watch", daemon=True).start()
