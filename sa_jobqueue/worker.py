"""The worker: a claim loop feeding job threads and an event loop, a heartbeat, a listener.

One worker process serves its queues in lanes (all queues sharing ``concurrency`` threads, or
one lane per queue with a concurrency each)::

    claim loop ──claims into free slots──► job threads (sync) ──► fenced completion
        ▲   ▲                        └──► event loop (async)       (batched, grouped, or
        │   └── slot freed when the buffer is half empty ◄─────────  with the handler's tx)
        └────── NOTIFY from enqueue, or the jittered poll as the safety net

Running jobs and recording outcomes lives in :mod:`sa_jobqueue.running`, lease renewal and
timeouts in :mod:`sa_jobqueue.heartbeat`; this module claims, and starts and stops the rest.

What it does not promise: that a handler runs once. A job whose worker dies, freezes past its
lease or loses its connection while completing runs again elsewhere. Writes through
``ctx.session`` commit together with the completion, so they happen exactly once.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from datetime import timedelta

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from . import periodic
from ._deadlines import guard_statements
from ._error_text import one_line
from ._sql import claiming, retention
from .attempts import Claimed, Held, Lane
from .completions import Completer
from .database import HeldConnection, check_schema, pooler_of
from .execution import EventLoopThread
from .heartbeat import HEARTBEAT_TICK, Heartbeat
from .listener import listen
from .models import RUNNING
from .observability import JobRun, Observer, Observers
from .ops import workers as operations
from .queue import JobQueue
from .running import ThreadState, resolve

log = logging.getLogger("sa_jobqueue.worker")

#: Seconds between pruning rounds (with a retention above zero).
PRUNE_INTERVAL = 60.0
#: Rows one pruning statement deletes at most; a round runs at most PRUNE_MAX_BATCHES of them,
#: so a long backlog of history is worked off over several rounds, never in one long lock.
PRUNE_BATCH = 1_000
PRUNE_MAX_BATCHES = 10
#: Longest wait between claim attempts while the database is unreachable (seconds).
OUTAGE_RETRY_CAP = 5.0
#: How often a worker refreshes its row in the worker registry (seconds), and after how long
#: without a refresh a row is taken for a dead worker's and deleted by any live worker.
PRESENCE_INTERVAL = 10.0
WORKER_STALE = timedelta(minutes=1)
#: How often periodic schedules are looked at (seconds): how late after its tick a periodic
#: job is enqueued, at most.
PERIODIC_INTERVAL = 1.0


class Worker(Heartbeat):
    """Runs the tasks of a :class:`JobQueue` against a database until stopped.

    ``queues`` defaults to every queue the registered tasks declare plus the default queue.
    ``poll_interval`` is the safety-net poll (jittered ±20%); with ``listen`` on, new jobs wake
    idle workers through LISTEN/NOTIFY long before it. ``shutdown_grace`` is how long
    :meth:`stop` lets running handlers finish; jobs still running after it are left to be
    reclaimed when their leases expire.

    Handlers' sessions use ``engine``: give it a pool of at least ``concurrency`` connections.
    ``retention`` is how long succeeded and cancelled jobs are kept (``None``: for ever; zero:
    deleted at the next poll); dead jobs are kept until requeued or purged.

    The worker's own statements use ``control_engine`` (default: ``engine``); the CLI passes
    one from :func:`sa_jobqueue.database.create_control_engine`, whose statement and lock
    timeouts keep a stuck lock or server from hanging the claim loop or the heartbeat.
    """

    def __init__(
        self,
        queue: JobQueue,
        engine: Engine,
        *,
        concurrency: int = 10,
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
            raise ValueError("concurrency must be at least 1")
        if prefetch is not None and prefetch < 0:
            raise ValueError("prefetch must not be negative")
        self.queue = queue
        self.engine = engine
        if isinstance(queues, Mapping):
            if not queues or any(n < 1 for n in queues.values()):
                raise ValueError("each queue's concurrency must be at least 1")
            self._lanes = [Lane([q], n, prefetch) for q, n in queues.items()]
        else:
            names = list(queues) if queues else _default_queues(queue)
            self._lanes = [Lane(names, concurrency, prefetch)]
        self.queues = [q for lane in self._lanes for q in lane.queues]
        for name in undeclared_queues(queue, self.queues):
            log.warning(
                "serving queue %r, which no registered task declares (a typo?); only jobs"
                " enqueued with queue=%r run there",
                name,
                name,
            )
        self._async_tasks = {
            name for name, t in queue.tasks.items() if inspect.iscoroutinefunction(t.handler)
        }
        if self._async_tasks and len(self._async_tasks) < len(queue.tasks):
            for lane in self._lanes:
                lane.kinds = 2
        self.concurrency = sum(lane.concurrency for lane in self._lanes)
        if retention is not None and retention < timedelta(0):
            raise ValueError("retention must not be negative")
        self.retention = retention
        self._next_prune = 0.0  # time.monotonic() of the next pruning round
        self.poll_interval = poll_interval
        self.shutdown_grace = shutdown_grace
        self.listen = listen
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"

        # The worker's own statements (claim, lease renewal, failure, timeout) each run on their
        # own in autocommit: no row lock can outlive its statement, so a worker frozen between
        # statement and COMMIT (SIGSTOP, a paused VM) cannot keep jobs hidden from SKIP LOCKED.
        # Each has a client-side deadline too (a silent network never hangs the worker).
        self._single = (control_engine or engine).execution_options(isolation_level="AUTOCOMMIT")
        guard_statements(self._single)
        self.pooler = pooler_of(control_engine or engine)
        if self.pooler == "transaction" and listen:
            # LISTEN needs a session of its own; behind a transaction pooler the poll serves.
            log.info("no LISTEN behind a transaction pooler: polling every %s", poll_interval)
            self.listen = False
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._halt = threading.Event()  # run() is over: stop renewing leases
        self._active: dict[int, Held] = {}
        self._futures: dict[Future[None], Claimed] = {}
        self._durations: dict[str, float] = {}  # task -> moving average of its run time
        self._claimer = HeldConnection(self._single)
        # Observers see each attempt's outcome once it is recorded; until then (a batched
        # completion, a group's commit) the attempt waits here with its handler's run time.
        self._observe = Observers(observers)
        self._settling: dict[tuple[int, int], tuple[JobRun, float | None]] = {}
        self._timed_out: set[tuple[int, int]] = set()  # reported when the timeout was recorded
        self._completer: Completer | None = None
        self._loop: EventLoopThread | None = None  # only for a queue with async handlers
        self._burst = False
        self._groups_open = 0

    # -- public -----------------------------------------------------------------------------

    def run(self, *, burst: bool = False) -> bool:
        """Claim and run jobs until :meth:`stop` is called (or, with ``burst``, until idle).

        Returns True if every started job finished, False if some were still running when the
        shutdown grace ran out (they will be reclaimed after their leases expire).
        """
        check_schema(self.engine)
        log.info(
            "worker %s serving %s with concurrency %d", self.name, self.queues, self.concurrency
        )
        self._completer = Completer(
            self._single, self._not_completed, self._completed, self._unrecorded
        )
        if self._async_tasks:
            self._loop = EventLoopThread(
                self.engine.url, pool_size=self.concurrency, pooler=self.pooler
            )
        job_threads = [
            (
                lane,
                threading.Thread(
                    target=self._job_thread,
                    args=(lane,),
                    name=f"sa_jobqueue-job-{lane.queues[0]}-{i}",
                    daemon=True,
                ),
            )
            for lane in self._lanes
            for i in range(lane.concurrency)
        ]
        helpers = [
            threading.Thread(
                target=self._heartbeat_loop, name="sa_jobqueue-heartbeat", daemon=True
            ),
            threading.Thread(target=self._upkeep_loop, name="sa_jobqueue-upkeep", daemon=True),
        ]
        if self.listen:
            helpers.append(
                threading.Thread(
                    target=listen,
                    args=(self.engine, self.queues, self._wake, self._stopping),
                    name="sa_jobqueue-listener",
                    daemon=True,
                )
            )
        for thread in [t for _, t in job_threads] + helpers:
            thread.start()
        try:
            self._claim_loop(burst)
        finally:
            self._claimer.close()
            self._stopping.set()
            self._release_unstarted()
            with self._lock:
                pending = set(self._futures)
            _, not_done = wait_futures(pending, timeout=self.shutdown_grace.total_seconds())
            # Threads that are free commit their open groups and end; jobs still running past
            # the grace keep their threads (Python cannot kill them), but their leases are no
            # longer renewed, so another worker will take them over.
            for lane, _ in job_threads:
                lane.ready.put(None)
            for _, thread in job_threads:
                thread.join(timeout=0.5 if not_done else None)
            if self._loop is not None:
                self._loop.close()
            self._completer.close()
            self._halt.set()
            for thread in helpers:
                thread.join(timeout=5)
            if not_done:
                log.warning(
                    "worker %s stopped with %d job(s) still running; they will be"
                    " reclaimed when their leases expire",
                    self.name,
                    len(not_done),
                )
        return not not_done

    def stop(self) -> None:
        """Stop claiming; :meth:`run` returns once running jobs finish (or the grace ends)."""
        self._stopping.set()
        self._wake.set()

    # -- claim loop -------------------------------------------------------------------------

    def _claim_loop(self, burst: bool) -> None:
        self._burst = burst
        outage = 0  # claims failed in a row
        while not self._stopping.is_set():
            # Clear before claiming: a NOTIFY that lands after the claim's snapshot sets the
            # event again and the wait below returns at once, so no wake-up is lost.
            self._wake.clear()
            self._maybe_prune()
            try:
                more = self._claim_round()
            except SQLAlchemyError as exc:  # the server, the network, or a pool time-out
                # Said once per outage, not once per try.
                if not outage:
                    log.warning("cannot claim (%s); retrying", one_line(exc))
                outage += 1
                more = False
            else:
                if outage:
                    log.info("claiming again: the database is back")
                outage = 0
            with self._lock:
                running = len(self._futures) + self._groups_open
                room = any(lane.saturated and lane.held < lane.capacity for lane in self._lanes)
            if more and room:
                continue  # work is waiting and slots are free (fast jobs already finished)
            if burst and not more and not running:
                return
            # With work waiting, a finishing job sets the event. Without, only a NOTIFY (or
            # the poll, jittered so idle workers do not poll in lockstep) can bring more.
            # During an outage the retries back off, up to OUTAGE_RETRY_CAP.
            interval = self.poll_interval.total_seconds()
            if outage:
                interval = min(interval * 2 ** min(outage - 1, 10), OUTAGE_RETRY_CAP)
            self._wake.wait(interval * random.uniform(0.8, 1.2))

    @property
    def prefetch(self) -> int:
        """Jobs claimed ahead of free threads, at most, over all lanes (it adapts if unset)."""
        return sum(lane.prefetch for lane in self._lanes)

    @property
    def capacity(self) -> int:
        """Jobs this worker holds at most: running, plus claimed and waiting for a thread."""
        return sum(lane.capacity for lane in self._lanes)

    def _claim_round(self) -> bool:
        """Claim into every lane's free slots. True if more work is probably waiting."""
        more = False
        for lane in self._lanes:
            more = self._claim_lane(lane) or more
        return more

    def _claim_lane(self, lane: Lane) -> bool:
        """Claim into a lane's free slots, queue by queue. True if more is probably waiting.

        "Probably waiting" means a claim returned as many jobs as it asked for, or a queue was
        not asked at all because the slots ran out first.
        """
        # Only a round that starts once the buffer has run low says how fast jobs drain it; a
        # NOTIFY or a poll that arrives while the buffer is still full says nothing.
        if lane.held <= lane.low_water:
            lane.adapt()
            lane.filled_at = 0.0
        n = len(lane.queues)
        start, lane.rotation = lane.rotation, (lane.rotation + 1) % n
        more = False
        for queue in (lane.queues[(start + i) % n] for i in range(n)):
            free = lane.capacity - lane.held
            if free <= 0:
                more = True
                break
            rows = self._claimer.rows(
                claiming.claim(), {"from_queue": queue, "limit": free, "worker": self.name}
            )
            more = more or len(rows) == free
            for row in rows:
                job = Claimed(*row)  # the columns claim() returns, in order
                if job.status != RUNNING:  # lost on its last attempt, or cancelled meanwhile
                    log.error(
                        "job %d (%s) lost its worker; not run again, now %s",
                        job.id,
                        job.task,
                        job.status,
                    )
                    continue
                self._submit(lane, job)
        if more and not lane.filled_at:
            lane.filled_at = time.monotonic()
        with self._lock:
            # Tell _finished whether a freed slot is worth waking the claim loop for.
            lane.saturated = more
        return more

    def _submit(self, lane: Lane, job: Claimed) -> None:
        future: Future[None] = Future()
        with self._lock:
            lane.held += 1
            self._active[job.id] = Held(
                job.attempts, job.lease, time.monotonic() + job.lease.total_seconds() / 3
            )
            self._futures[future] = job
        future.add_done_callback(
            functools.partial(self._finished, lane=lane, job_id=job.id, attempt=job.attempts)
        )
        if job.task in self._async_tasks:
            # Straight to the event loop: an async handler needs no thread, so it starts even
            # while every thread is busy.
            future.set_running_or_notify_cancel()
            pending = self._execute(job, ThreadState(lane))
            if pending is None:
                future.set_result(None)
            else:
                pending.add_done_callback(functools.partial(resolve, future))
            return
        lane.ready.put((future, job))

    def _finished(self, future: Future[None], lane: Lane, job_id: int, attempt: int) -> None:
        with self._lock:
            self._futures.pop(future, None)
            lane.held -= 1
            # A timed-out attempt that ran on can finish after this worker claimed the job's
            # next attempt: leave that one registered, or it would never be renewed.
            # A job whose completion waits for its group's commit keeps its lease renewed.
            held = self._active.get(job_id)
            if held is not None and held.attempt == attempt and not held.grouped:
                del self._active[job_id]
            # A freed slot only matters if the last claim left work behind, and then once the
            # buffer of claimed jobs has run dry, so the next claim brings a batch. In burst
            # mode the loop also needs to notice when the last job is done.
            wake = self._burst or (lane.saturated and lane.held <= lane.low_water)
            if wake:
                lane.saturated = False
        if wake:
            self._wake.set()

    def _release_unstarted(self) -> None:
        """On shutdown, hand the claimed jobs no thread has started back, attempt uncounted."""
        with self._lock:
            waiting = list(self._futures.items())
        # Future.cancel() runs the done callback (which takes the lock) in this thread, and
        # succeeds only for a job no thread has taken yet; a thread skips a cancelled one.
        unstarted = [job for future, job in waiting if future.cancel()]
        if unstarted:
            self._hand_back(unstarted, "they had not started")

    # -- retention --------------------------------------------------------------------------

    def _maybe_prune(self) -> None:
        """Prune finished jobs past their retention, when due; one worker at a time."""
        if self.retention is None or time.monotonic() < self._next_prune:
            return
        # Every minute, or at every poll when finished jobs are to go at once; jittered so
        # workers started together do not all try at the same moment.
        interval = PRUNE_INTERVAL if self.retention else self.poll_interval.total_seconds()
        self._next_prune = time.monotonic() + interval * random.uniform(0.8, 1.2)
        try:
            deleted = self.prune()
        except SQLAlchemyError as exc:
            log.warning("pruning failed: %s", one_line(exc))
            return
        if deleted:
            log.info("pruned %d finished job(s)", deleted)

    def prune(self, *, max_batches: int = PRUNE_MAX_BATCHES) -> int:
        """Delete succeeded and cancelled jobs older than ``retention``; return how many.

        Runs in bounded batches of PRUNE_BATCH rows, each its own short transaction, and only
        while this worker holds the prune advisory lock, so two workers never prune at once.
        Returns 0 without waiting when another session holds the lock.
        """
        if self.retention is None:
            return 0
        params = {"retention": self.retention.total_seconds(), "limit": PRUNE_BATCH}
        total = 0
        for _ in range(max_batches):
            with self.engine.begin() as conn:
                if not conn.execute(retention.try_prune_lock()).scalar():
                    return total
                deleted = conn.execute(retention.prune(), params).rowcount
            total += deleted
            if deleted < PRUNE_BATCH:
                break
        return total

    # -- upkeep: the worker registry and periodic schedules ---------------------------------

    def _upkeep_loop(self) -> None:
        """Keep this worker's registry row fresh and enqueue periodic jobs as they fall due.

        Neither is needed to run jobs: a failure is logged (once until it works again) and
        retried at the next round. Periodic jobs stop with claiming; the registry row stays
        until the last job has finished or been given up.
        """
        next_presence = next_periodic = 0.0
        failing: set[str] = set()
        while True:
            now = time.monotonic()
            if self.queue.schedules and not self._stopping.is_set() and now >= next_periodic:
                next_periodic = now + PERIODIC_INTERVAL * random.uniform(0.9, 1.1)
                with self._upkeep_step("periodic schedules", failing):
                    if periodic.enqueue_due(self._single, self.queue):
                        self._wake.set()
            if now >= next_presence:
                next_presence = now + PRESENCE_INTERVAL
                with self._upkeep_step("worker registry", failing):
                    self._be_present()
            if self._halt.wait(HEARTBEAT_TICK * 2.5):
                break
        with self._upkeep_step("worker registry", failing), self._single.connect() as conn:
            operations.unregister_worker(conn, self.name)

    def _be_present(self) -> None:
        with self._single.connect() as conn:
            if not operations.touch_worker(conn, self.name):
                host, pid = socket.gethostname(), os.getpid()
                operations.register_worker(
                    conn, self.name, host, pid, self.queues, self.concurrency
                )
            operations.expire_workers(conn, WORKER_STALE)

    @contextlib.contextmanager
    def _upkeep_step(self, what: str, failing: set[str]) -> Iterator[None]:
        try:
            yield
        except Exception as exc:  # the database, or a task's unique_key function
            if what not in failing:
                log.warning("%s: %s; retrying", what, one_line(exc))
            failing.add(what)
        else:
            if what in failing:
                log.info("%s: working again", what)
            failing.discard(what)


def _default_queues(queue: JobQueue) -> list[str]:
    return sorted(_declared_queues(queue))


def _declared_queues(queue: JobQueue) -> set[str]:
    """The queues the tasks declare, and the default queue (where undeclared ones go)."""
    return {task.queue for task in queue.tasks.values()} | {queue.default_queue}


def undeclared_queues(queue: JobQueue, served: Iterable[str]) -> list[str]:
    """The queues of ``served`` that no task of ``queue`` declares, in order.

    The JobQueue's ``default_queue`` is not counted: it is where a task declared without a
    queue goes. A queue listed here is not necessarily wrong (enqueue's ``queue=`` can send
    any task's jobs anywhere), which is why the worker warns and does not refuse.
    """
    declared = _declared_queues(queue)
    return [name for name in served if name not in declared]
