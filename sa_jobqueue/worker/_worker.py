"""The Worker: validates its options, starts the collaborators ``_wiring`` builds, stops them."""

from __future__ import annotations

import inspect
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Unpack

from sqlalchemy import Engine
from sqlalchemy.engine import URL
from sqlalchemy.exc import SQLAlchemyError

from .._binds import transient
from .._deadlines import StopClock, guard_statements
from .._error_text import one_line
from .._pooler import TRANSACTION_POOLER_HINT, on_prepared_statement_clash
from ..database import HeldConnection, Pooler, check_schema, pooler_of
from ..errors import DatabaseUnavailableError, WorkerConfigError
from ..observability import Observer, Observers
from ..queue import JobQueue
from ._embedding import CONCURRENCY, WorkerOptions, engines_for, run_on_loop
from ._lanes import Lane, default_queues, undeclared_queues
from ._leases import LeaseTable, Ticket
from ._pulse import Pulse, stall_bound
from ._recorder import Recorder
from ._retries import retrying
from ._served import Served
from ._upkeep import PRUNE_MAX_BATCHES, Pruner
from ._wiring import wire

log = logging.getLogger("sa_jobqueue.worker")

#: How long, past its shutdown grace, a stopping worker may spend writing what it still owes
#: (hand-backs, outcomes, its registry row) before it exits anyway (seconds). What is not
#: written by then is left to the leases: those jobs are reclaimed once their leases expire.
STOP_MARGIN = 10.0


class Worker:
    """Runs the tasks of a :class:`JobQueue` against a database until stopped.

    ``queues`` defaults to every queue the registered tasks declare plus the default queue.
    An entry may be a pattern: ``*`` stands for any characters and ``?`` for one, so
    ``"tenant-*"`` serves every queue whose name starts so, and ``"*"`` every queue, without
    listing them. A worker serving a pattern, or more than one queue in a lane, claims from all
    of them in one statement, the queues taking turns (see "Many queues" in the flow-control
    guide); a queue with a pause or a limit is claimed on its own, as always.
    ``poll_interval`` is the safety-net poll (jittered ±20%); with ``listen`` on, new jobs wake
    idle workers through LISTEN/NOTIFY long before it. ``shutdown_grace`` is how long
    :meth:`stop` lets running handlers finish; jobs still running after it are left to be
    reclaimed when their leases expire.

    Handlers' sessions use ``engine``: give it a pool of at least ``concurrency`` connections.
    ``retention`` is how long succeeded and cancelled jobs are kept (``None``: for ever; zero:
    deleted at the next poll); dead jobs are kept until requeued or purged.

    The worker's own statements use ``control_engine`` (default: ``engine``); :meth:`from_url`
    (and so the CLI) makes one with :func:`sa_jobqueue.database.create_control_engine`, whose
    statement and lock timeouts keep a stuck lock or server from hanging the claim loop.

    Raises :class:`~sa_jobqueue.errors.WorkerConfigError` (a ValueError) for an option out of
    range. What it does not promise: that a handler runs once (see :mod:`sa_jobqueue.worker`).
    """

    def __init__(
        self,
        queue: JobQueue,
        engine: Engine,
        *,
        concurrency: int = CONCURRENCY,
        queues: Iterable[str] | Mapping[str, int] | None = None,
        poll_interval: timedelta = timedelta(seconds=1),
        shutdown_grace: timedelta = timedelta(seconds=30),
        listen: bool = True,
        name: str | None = None,
        control_engine: Engine | None = None,
        prefetch: int | None = None,
        retention: timedelta | None = timedelta(days=1),
        observers: Sequence[Observer] = (),
    ) -> None:
        if concurrency < 1:
            raise WorkerConfigError("concurrency must be at least 1")
        if prefetch is not None and prefetch < 0:
            raise WorkerConfigError("prefetch must not be negative")
        self.queue = queue
        self.engine = engine
        self.control_engine = control_engine or engine
        self._owned: tuple[Engine, ...] = ()  # engines from_url made, disposed after run()
        async_tasks = [t for t in queue.tasks.values() if inspect.iscoroutinefunction(t.handler)]
        self._has_async = bool(async_tasks)
        # Async handlers beside sync ones: each kind gets the room of a whole lane (see Lane).
        kinds = 2 if async_tasks and len(async_tasks) < len(queue.tasks) else 1
        if isinstance(queues, Mapping):
            if not queues or any(n < 1 for n in queues.values()):
                raise WorkerConfigError("each queue's concurrency must be at least 1")
            self._lanes = [Lane([q], n, prefetch, kinds) for q, n in queues.items()]
        else:
            names = list(queues) if queues else default_queues(queue)
            self._lanes = [Lane(names, concurrency, prefetch, kinds)]
        self.queues = [q for lane in self._lanes for q in lane.queues]
        self.served = Served(self.queues)
        # Not ``name``: that is the worker's own name, read below. One line, however many.
        undeclared = undeclared_queues(queue, self.queues)
        if len(undeclared) == 1:
            log.warning(
                "serving queue %r, which no registered task declares (a typo?); only jobs"
                " enqueued with queue=%r run there",
                undeclared[0],
                undeclared[0],
            )
        elif undeclared:
            log.warning(
                "serving %s that no registered task declares (typos?); only jobs enqueued"
                " with queue= one of them run there",
                Served(undeclared).describe(),
            )
        self.concurrency = sum(lane.concurrency for lane in self._lanes)
        if retention is not None and retention < timedelta(0):
            raise WorkerConfigError("retention must not be negative")
        self.retention = retention
        self.poll_interval = poll_interval
        self.shutdown_grace = shutdown_grace
        self.listen = listen
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"

        # The worker's own statements (claim, lease renewal, failure, timeout) each run on their
        # own in autocommit: no row lock can outlive its statement, so a worker frozen between
        # statement and COMMIT (SIGSTOP, a paused VM) cannot keep jobs hidden from SKIP LOCKED.
        # Each has a client-side deadline too (a silent network never hangs the worker).
        # Once stopping, those statements are hurried, so that the worker is gone by its
        # shutdown grace and STOP_MARGIN whatever the network does (see StopClock).
        self._clock = StopClock()
        self._single = (control_engine or engine).execution_options(isolation_level="AUTOCOMMIT")
        guard_statements(self._single, clock=self._clock)
        self.pooler = pooler_of(control_engine or engine)
        self._fatal: DatabaseUnavailableError | None = None  # run() raises it once stopped
        if self.pooler == "session":
            on_prepared_statement_clash(self._single, self._behind_a_transaction_pooler)
        if self.pooler == "transaction" and listen:
            # LISTEN needs a session of its own; behind a transaction pooler the poll serves.
            log.info("no LISTEN behind a transaction pooler: polling every %s", poll_interval)
            self.listen = False
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._halt = threading.Event()  # run() is over: stop renewing leases
        self._pulse = Pulse()  # the loops' last turns, for stalled()
        self._leases = LeaseTable()  # until run() makes its own, for a burst or not
        self._claimer = HeldConnection(self._single)
        # Pruning runs on the claim loop's thread, between rounds, on the handlers' engine: its
        # statements get the same deadline, so a connection gone silent cannot stop claiming.
        pruning = engine.execution_options()
        guard_statements(pruning, clock=self._clock)
        self._pruner = Pruner(pruning, retention, poll_interval)
        # Observers see each attempt's outcome once it is recorded (see Reports).
        self._observe = Observers(observers)

    @classmethod
    def from_url(
        cls,
        url: str | URL,
        queue: JobQueue,
        *,
        pooler: Pooler = "session",
        **options: Unpack[WorkerOptions],
    ) -> Worker:
        """A worker and its engines, from a database URL, as ``sa-jobqueue worker`` builds them.

        The handlers' engine gets a connection per job thread (two more at most), the worker's
        own statements a control engine with statement and lock timeouts
        (:func:`~sa_jobqueue.database.create_control_engine`); ``pooler`` is
        :func:`~sa_jobqueue.database.create_engine`'s, ``options`` the constructor's keywords
        (all but ``control_engine``). The worker owns both engines: :meth:`run` disposes of
        their pooled connections as it returns. Connects to nothing until :meth:`run`.
        """
        engine, control = engines_for(url, options, pooler)
        try:
            worker = cls(queue, engine, control_engine=control, **options)
        except BaseException:
            engine.dispose()
            control.dispose()
            raise
        worker._owned = (engine, control)
        return worker

    async def arun(self, *, burst: bool = False) -> bool:
        """:meth:`run` for an asyncio application: awaits the worker without blocking the loop.

        The worker runs on a thread of its own. Cancelling the awaiting task stops it as
        :meth:`stop` does (running jobs get the shutdown grace), waits for that, then lets the
        cancellation go on; :meth:`stop` from anywhere makes it return :meth:`run`'s result.
        """
        return await run_on_loop(self, burst)

    @property
    def _tickets(self) -> dict[Ticket, None]:
        """The claimed jobs not finished yet (a live view, for tests)."""
        return self._leases.tickets

    @property
    def prefetch(self) -> int:
        """Jobs claimed ahead of free threads, at most, over all lanes (it adapts if unset)."""
        return sum(lane.prefetch for lane in self._lanes)

    @property
    def capacity(self) -> int:
        """Jobs this worker holds at most: running, plus claimed and waiting for a thread."""
        return sum(lane.capacity for lane in self._lanes)

    def _check_schema(self) -> None:
        """check_schema, tried again on a passing connection fault (a backend terminated, a
        refused connection) for a few seconds, then DatabaseUnavailableError: a worker
        starting during a failover or a pooler restart starts once the database answers.

        It reads over the worker's own statements' engine, whose client-side deadline cuts a
        connection gone silent under it (the handlers' engine has none mid-statement)."""
        try:
            retrying(lambda: check_schema(self._single), "checking the schema")
        except SQLAlchemyError as exc:
            if not transient(exc):
                raise
            raise DatabaseUnavailableError(f"cannot check the schema: {one_line(exc)}") from exc

    def run(self, *, burst: bool = False) -> bool:
        """Claim and run jobs until :meth:`stop` is called (or, with ``burst``, until idle).

        A burst returns once a claim round starts nothing, none of its jobs runs and none of
        their completions is still to be written. It waits for a used-up rate window only if
        it opens within ``BURST_WINDOW_WAIT`` (10 s); a pause, a future ``run_at``, a
        dependency it does not run, and a cap whose slots other workers hold all end it.

        Returns True if every started job finished and its outcome was written, False if some
        were still running when the shutdown grace ran out, or some outcome was still not
        written ``STOP_MARGIN`` seconds after it (those jobs are reclaimed after their leases
        expire). Raises
        :class:`~sa_jobqueue.errors.DatabaseUnavailableError`, once stopped, if its statements
        met the prepared-statement errors of an undeclared transaction pooler (see
        :func:`sa_jobqueue.database.create_engine`'s ``pooler``).
        """
        try:
            self._check_schema()
        except BaseException:
            for owned in self._owned:  # as once run: what from_url made holds no connection
                owned.dispose()
            raise
        log.info(
            "worker %s serving %s with concurrency %d",
            self.name,
            self.served.describe(),
            self.concurrency,
        )
        self._leases = LeaseTable(burst=burst)

        wired = wire(self, burst)
        recorder, loop, claims = wired.recorder, wired.loop, wired.claims
        job_threads, helpers = wired.job_threads, wired.helpers
        for thread in job_threads + helpers:
            thread.start()
        try:
            claims.run(burst)
        finally:
            self._clock.stop(self._stop_seconds)  # a burst's end, or an error's
            self._claimer.close()
            self._stopping.set()
            self._leases.shut_down()  # running handlers see ctx.stop_requested
            self._release_unstarted(recorder)
            assert self._clock.stopped_at is not None
            grace_left = self._clock.stopped_at + self.shutdown_grace.total_seconds()
            not_done = self._leases.wait_all_done(max(0.0, grace_left - time.monotonic()))
            # Threads that are free commit their open groups and end; jobs still running past
            # the grace keep their threads (Python cannot kill them), but their leases are no
            # longer renewed, so another worker will take them over.
            for lane in self._lanes:
                lane.finish_threads()
            for thread in job_threads:
                thread.join(timeout=0.5 if not_done else self._clock.left())
            if loop is not None:
                loop.close()
            unwritten = recorder.close(timeout=self._clock.left())
            self._halt.set()
            for thread in helpers:
                thread.join(timeout=min(5.0, self._clock.left()))
            self._pulse.clear()
            if not_done:
                log.warning(
                    "worker %s stopped with %d job(s) still running; they will be"
                    " reclaimed when their leases expire",
                    self.name,
                    len(not_done),
                )
            if unwritten:
                log.warning(
                    "worker %s stopped with %d outcome(s) not written; their jobs will be"
                    " reclaimed when their leases expire",
                    self.name,
                    unwritten,
                )
            for owned in self._owned:
                owned.dispose()
        if self._fatal is not None:
            raise self._fatal
        return not not_done and not unwritten

    def _lane_of(self, queue: str) -> Lane:
        """The lane that serves ``queue``: the first whose names or patterns take it."""
        return next(lane for lane in self._lanes if queue in lane.served)

    def _behind_a_transaction_pooler(self) -> None:
        """Statements failed as they do behind a transaction pooler: stop, saying what to pass
        (retrying would only flap between "cannot claim" and "the database is back")."""
        if self._fatal is None:
            self._fatal = DatabaseUnavailableError(TRANSACTION_POOLER_HINT)
            log.error("stopping: %s", TRANSACTION_POOLER_HINT)
            self.stop()

    @property
    def stopping(self) -> bool:
        """Whether the worker was told to stop (or its run ended): it claims no more."""
        return self._stopping.is_set()

    def stalled(self, after: timedelta | None = None) -> dict[str, float]:
        """The worker's loops (claim loop, heartbeat) that have not gone round for ``after``,
        with how long since they did, in seconds: empty while the worker is alive.

        ``after`` defaults to a bound derived from ``poll_interval`` (70 s at 1 s; see
        ``_pulse.stall_bound``). Empty, too, before :meth:`run` starts its loops and once
        :meth:`stop` was called (a stopping worker's claim loop is over by design). What it
        does not tell: whether the database answers (the loops go on through an outage).
        """
        if self._stopping.is_set():
            return {}
        return self._pulse.stalled(after or stall_bound(self.poll_interval))

    def stop(self) -> None:
        """Stop claiming; :meth:`run` returns once running jobs finish (or the grace ends).

        Running handlers see ``ctx.stop_requested`` turn True as :meth:`run` winds down. From
        now on, :meth:`run` returns within ``shutdown_grace`` and ``STOP_MARGIN`` whatever the
        network does: what it could not write by then is left to the jobs' leases."""
        self._clock.stop(self._stop_seconds)
        self._stopping.set()
        self._wake.set()

    @property
    def _stop_seconds(self) -> float:
        """How long after the stop the worker must be gone: its grace and STOP_MARGIN."""
        return self.shutdown_grace.total_seconds() + STOP_MARGIN

    def prune(self, *, max_batches: int = PRUNE_MAX_BATCHES) -> int:
        """Delete succeeded and cancelled jobs older than ``retention``; return how many.

        Runs in bounded batches, each its own short transaction, and only while this worker
        holds the prune advisory lock, so two workers never prune at once. Returns 0 without
        waiting when another session holds the lock.
        """
        return self._pruner.prune(max_batches=max_batches)

    def _release_unstarted(self, recorder: Recorder) -> None:
        """On shutdown, hand the claimed jobs no thread has started back, attempt uncounted."""
        # Only jobs no thread has taken yet; a thread skips a job handed back.
        unstarted = self._leases.hand_back_waiting()
        if unstarted:
            recorder.hand_back(unstarted, "they had not started")
