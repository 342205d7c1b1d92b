"""The worker: a claim loop, a thread pool of handlers, a lease-renewing heartbeat, a listener.

One worker process serves a list of queues with ``concurrency`` handler threads::

    claim loop ──claims up to the free slots──► thread pool ──► fenced completion (handler's tx)
        ▲   ▲                                       │
        │   └──── slot freed (when saturated) ◄─────┘
        └──────── NOTIFY from enqueue, or the jittered poll as the safety net

What it does not promise: that a handler runs once. A job whose worker dies, freezes past its
lease or loses its connection while completing runs again elsewhere. Writes through
``ctx.session`` commit together with the completion, so they happen exactly once.
"""

from __future__ import annotations

import asyncio
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
from collections.abc import Awaitable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import timedelta
from queue import Empty, SimpleQueue
from typing import TYPE_CHECKING, Any, cast

import psycopg
from sqlalchemy import Connection, CursorResult, Engine, Row
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import Session

from . import operations, periodic, statements
from .completions import Completer
from .database import HeldConnection, check_schema
from .errors import PayloadError, UnknownTaskError
from .execution import (
    EventLoopThread,
    GroupSession,
    HandlerSession,
    decode,
    error_json,
    one_line,
    supervised,
)
from .listener import listen
from .models import CANCELLED, DEAD, RUNNING
from .observability import JobRun, Observer, Observers
from .queue import JobQueue
from .tasks import Discard, JobContext, Retry, Task

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

log = logging.getLogger("sa_jobqueue.worker")

#: How often the heartbeat thread looks for leases due for renewal (seconds). It only talks to
#: the database when one is due.
HEARTBEAT_TICK = 0.1
#: How soon a lease whose row was locked by another transaction is renewed again (seconds).
HEARTBEAT_RETRY = 0.5
#: The adaptive claim buffer (no explicit prefetch) grows while a full buffer drains faster
#: than PREFETCH_FAST seconds, shrinks while it takes longer than PREFETCH_SLOW, and stays
#: between 1 and PREFETCH_MAX_FACTOR times the concurrency.
PREFETCH_FAST = 0.05
PREFETCH_SLOW = 1.0
PREFETCH_MAX_FACTOR = 8
#: Seconds between pruning rounds (with a retention above zero).
PRUNE_INTERVAL = 60.0
#: Rows one pruning statement deletes at most; a round runs at most PRUNE_MAX_BATCHES of them,
#: so a long backlog of history is worked off over several rounds, never in one long lock.
PRUNE_BATCH = 1_000
PRUNE_MAX_BATCHES = 10
#: Longest wait between claim attempts while the database is unreachable (seconds).
OUTAGE_RETRY_CAP = 5.0
#: Jobs that write through their session share one transaction, a savepoint each, with the
#: jobs their thread runs right after them, so that many jobs cost one commit (one fsync) and
#: one completing statement instead of one each. Only tasks whose handlers recently ran faster
#: than GROUP_FAST seconds (a moving average) join a group: for them the commit is most of the
#: cost, and a group of them holds its handlers' row locks only briefly. A group commits when
#: it has GROUP_MAX_JOBS jobs, is GROUP_MAX_AGE seconds old, its thread finds no job waiting
#: for GROUP_IDLE seconds, or a slower task is next. GROUP_MAX_JOBS stays below 64: each job's
#: savepoint that writes takes a subtransaction id, and past 64 in one transaction PostgreSQL
#: overflows its per-backend cache of them, which slows every other session's snapshots.
GROUP_FAST = 0.02
GROUP_MAX_JOBS = 50
GROUP_MAX_AGE = 0.05
GROUP_IDLE = 0.001
#: How often a worker refreshes its row in the worker registry (seconds), and after how long
#: without a refresh a row is taken for a dead worker's and deleted by any live worker.
PRESENCE_INTERVAL = 10.0
WORKER_STALE = timedelta(minutes=1)
#: How often periodic schedules are looked at (seconds): how late after its tick a periodic
#: job is enqueued, at most.
PERIODIC_INTERVAL = 1.0
#: Weight of the newest run in a task's moving average of run times.
DURATION_WEIGHT = 0.2


@dataclass
class _Held:
    """What the heartbeat needs to know about one job this worker is running."""

    attempt: int
    lease: timedelta
    renew_at: float  # time.monotonic() of the next renewal
    ctx: JobContext | None = None
    task: Task | None = None
    deadline: float | None = None  # time.monotonic() when the task's timeout runs out
    grouped: bool = False  # finished, its completion waiting for its group's commit
    run: JobRun | None = None  # for observers


@dataclass
class _Group:
    """A job thread's open transaction, shared by the fast writing jobs it runs in a row."""

    conn: Connection
    opened: float = field(default_factory=time.monotonic)
    done: list[_Claimed] = field(default_factory=list)  # succeeded, completion pending

    @property
    def due(self) -> bool:
        return len(self.done) >= GROUP_MAX_JOBS or time.monotonic() - self.opened >= GROUP_MAX_AGE


class _Lane:
    """Queues that share a set of job threads and a claim buffer.

    A worker has one lane for all its queues, or, with a concurrency per queue, one lane per
    queue: each then claims into its own threads and buffer, and a busy queue cannot take the
    threads of another.
    """

    def __init__(self, queues: list[str], concurrency: int, prefetch: int | None) -> None:
        self.queues = queues
        self.concurrency = concurrency
        # Jobs claimed ahead of free threads, so that one claim brings a batch. Left unset,
        # the buffer adapts: it doubles while jobs drain it within PREFETCH_FAST (short jobs:
        # fewer, larger claims) and halves while they take longer than PREFETCH_SLOW (long
        # jobs: do not sit on work another worker could start).
        self.adaptive = prefetch is None
        self.prefetch = concurrency if prefetch is None else prefetch
        self.max_prefetch = PREFETCH_MAX_FACTOR * concurrency
        self.filled_at = 0.0  # time.monotonic() of the last claim that filled the buffer
        self.saturated = False  # the last claim left work behind
        self.rotation = 0
        self.held = 0  # claimed and not finished (under the worker's lock)
        # 2 when async handlers run on the event loop beside sync ones on threads: each kind
        # gets the room of a whole lane, so one kind cannot fill the other's slots.
        self.kinds = 1
        # Claimed jobs on their way to a job thread; None tells a thread to finish.
        self.ready: SimpleQueue[tuple[Future[None], _Claimed] | None] = SimpleQueue()
        # How many of the lane's async handlers run at once (made on the event loop).
        self.async_slots: asyncio.Semaphore | None = None

    @property
    def capacity(self) -> int:
        """Jobs the lane holds at most: running, plus claimed and waiting for a thread."""
        return (self.concurrency + self.prefetch) * self.kinds

    @property
    def low_water(self) -> int:
        """Jobs held when the next claim goes out: the buffer is half empty, so the claim's
        round trip overlaps with the other half running, and each claim brings a batch."""
        return self.capacity - self.prefetch * self.kinds // 2

    def adapt(self) -> None:
        if not self.adaptive or not self.filled_at:
            return
        drained_in = time.monotonic() - self.filled_at
        if drained_in < PREFETCH_FAST:
            self.prefetch = min(max(self.prefetch * 2, 1), self.max_prefetch)
        elif drained_in > PREFETCH_SLOW:
            self.prefetch = max(self.prefetch // 2, 1)


class _Thread:
    """What one job thread carries from job to job: its open group and its connection."""

    __slots__ = ("conn", "group", "lane")

    def __init__(self, lane: _Lane) -> None:
        self.lane = lane
        self.group: _Group | None = None
        self.conn: Connection | None = None  # kept between groups while work is waiting


@dataclass(frozen=True)
class _Claimed:
    id: int
    queue: str
    task: str
    payload: str  # JSON text, decoded per job
    status: str
    attempts: int
    max_attempts: int
    lease: timedelta
    trace_context: dict[str, str] | None

    def run(self) -> JobRun:
        return JobRun(
            self.id, self.task, self.queue, self.attempts, self.max_attempts, self.trace_context
        )


class Worker:
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
            self._lanes = [_Lane([q], n, prefetch) for q, n in queues.items()]
        else:
            names = list(queues) if queues else _default_queues(queue)
            self._lanes = [_Lane(names, concurrency, prefetch)]
        self.queues = [q for lane in self._lanes for q in lane.queues]
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
        self._single = (control_engine or engine).execution_options(isolation_level="AUTOCOMMIT")
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._halt = threading.Event()  # run() is over: stop renewing leases
        self._active: dict[int, _Held] = {}
        self._futures: dict[Future[None], _Claimed] = {}
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
            self._loop = EventLoopThread(self.engine.url, pool_size=self.concurrency)
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
                running = len(self._futures)
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

    def _claim_lane(self, lane: _Lane) -> bool:
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
                statements.claim(), {"from_queue": queue, "limit": free, "worker": self.name}
            )
            more = more or len(rows) == free
            for row in rows:
                job = _Claimed(*row)  # the columns claim() returns, in order
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

    def _submit(self, lane: _Lane, job: _Claimed) -> None:
        future: Future[None] = Future()
        with self._lock:
            lane.held += 1
            self._active[job.id] = _Held(
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
            pending = self._execute(job, _Thread(lane))
            if pending is None:
                future.set_result(None)
            else:
                pending.add_done_callback(functools.partial(_resolve, future))
            return
        lane.ready.put((future, job))

    def _finished(self, future: Future[None], lane: _Lane, job_id: int, attempt: int) -> None:
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

    def _hand_back(self, jobs: list[_Claimed], why: str) -> None:
        """Return attempts to the queue as if never claimed (fenced): due again at once."""
        try:
            with self._single.connect() as conn:
                released = conn.execute(
                    statements.release(),
                    {
                        "job_ids": [job.id for job in jobs],
                        "attempt_list": [job.attempts for job in jobs],
                    },
                ).all()
        except DBAPIError as exc:
            log.warning(
                "could not hand back %d job(s) (%s); they will be reclaimed when their leases"
                " expire",
                len(jobs),
                one_line(exc),
            )
            return
        log.info("handed back %d claimed job(s): %s", len(released), why)

    def _completed(self, done: list[tuple[int, int]]) -> None:
        """Batched completions recorded: tell the observers."""
        for job_id, attempt in done:
            self._report(job_id, attempt, "succeeded")

    def _unrecorded(self, lost: list[tuple[int, int]]) -> None:
        for job_id, attempt in lost:
            self._report(job_id, attempt, "lost")

    def _report(
        self, job_id: int, attempt: int, outcome: str, error: BaseException | None = None
    ) -> None:
        """Tell the observers an attempt's outcome (once: later reports find nothing)."""
        if self._observe:
            entry = self._settling.pop((job_id, attempt), None)
            if entry is not None:
                self._observe.finished(entry[0], outcome, entry[1], error)

    def _not_completed(self, job_id: int, attempt: int) -> None:
        """A completion matched no row: the job was cancelled, or the attempt is stale (its
        lease was lost or it timed out). Either way its writes were rolled back."""
        with self._single.connect() as conn:
            fence = {"job_id": job_id, "attempt": attempt}
            cancelled = conn.execute(statements.finish_cancelled(), fence).rowcount == 1
        self._report(job_id, attempt, "cancelled" if cancelled else "lost")
        if cancelled:
            log.info("job %d was cancelled", job_id)
        else:
            log.warning(
                "job %d: attempt %d lost its lease (or timed out) before completing",
                job_id,
                attempt,
            )

    # -- running one job --------------------------------------------------------------------

    def _job_thread(self, lane: _Lane) -> None:
        """Run a lane's claimed jobs one after another until told to finish."""
        here = _Thread(lane)
        while True:
            try:
                # With a group open, do not sit on its row locks waiting for work.
                item = lane.ready.get(timeout=GROUP_IDLE if here.group else None)
            except Empty:
                self._commit_group(here)
                continue
            if item is None:
                self._commit_group(here)
                self._drop_connection(here)
                return
            future, job = item
            if not future.set_running_or_notify_cancel():
                continue  # handed back on shutdown before it started
            try:
                self._execute(job, here)
                # Commit before the job counts as finished: a burst ends once nothing runs,
                # and what the group's jobs wrote (jobs they enqueued) must be in by then.
                if here.group is not None and (here.group.due or lane.ready.empty()):
                    self._commit_group(here)
            finally:
                future.set_result(None)

    def _commit_group(self, here: _Thread) -> None:
        """Complete the group's jobs in one fenced statement and commit their work with it.

        If any of them can no longer complete (cancelled, or its lease lost), the whole
        group rolls back: the others are handed back to the queue to run again (their
        writes were rolled back with the rest), which is rare enough to cost nothing.
        """
        group, here.group = here.group, None
        if group is None:
            return
        jobs = group.done
        try:
            done: set[int] = set()
            if jobs:
                done = set(
                    group.conn.execute(
                        statements.complete_many(),
                        {
                            "job_ids": [job.id for job in jobs],
                            "attempt_list": [job.attempts for job in jobs],
                        },
                    ).scalars()
                )
            if len(done) == len(jobs):
                group.conn.commit()
            else:
                group.conn.rollback()
        except SQLAlchemyError as exc:
            # Nothing of these jobs was written, their completions included: they are still
            # running in the database, and run again once their leases expire.
            log.error(
                "could not commit the work of %d job(s) (%s); they will be retried after their"
                " leases expire",
                len(jobs),
                one_line(exc),
            )
            self._drop_connection(here)
            self._settle(jobs)
            for job in jobs:
                self._report(job.id, job.attempts, "lost", exc)
            return
        if here.lane.ready.empty():
            self._drop_connection(here)  # else keep it for the next group: work is waiting
        self._settle(jobs)
        for job in jobs:
            if job.id in done and len(done) == len(jobs):
                self._report(job.id, job.attempts, "succeeded")
        if len(done) < len(jobs):
            stale = [job for job in jobs if job.id not in done]
            again = [job for job in jobs if job.id in done]
            for job in stale:
                self._not_completed(job.id, job.attempts)
            if again:
                self._hand_back(again, "their shared transaction was rolled back")
                for job in again:
                    self._report(job.id, job.attempts, "handed_back")

    def _settle(self, jobs: list[_Claimed]) -> None:
        """Forget the leases of a group's jobs once it has committed or rolled back."""
        with self._lock:
            for job in jobs:
                held = self._active.get(job.id)
                if held is not None and held.attempt == job.attempts:
                    del self._active[job.id]

    def _drop_connection(self, here: _Thread) -> None:
        conn, here.conn = here.conn, None
        if conn is not None:
            conn.close()

    def _group_session(self, here: _Thread) -> Session:
        if here.group is None:
            if here.conn is None:
                here.conn = self.engine.connect()
            here.group = _Group(here.conn)
            here.conn.begin()
        return GroupSession(here.group.conn)

    def _execute(self, job: _Claimed, here: _Thread) -> Future[None] | None:
        try:
            return self._execute_fenced(job, here)
        except (DBAPIError, psycopg.Error) as exc:  # psycopg's own: a group's savepoints
            # The outcome could not be recorded (connection lost, server gone). The job stays
            # running in the database and is reclaimed when its lease runs out.
            log.error(
                "job %d: could not record the outcome of attempt %d (%s); it will be"
                " retried after its lease expires",
                job.id,
                job.attempts,
                one_line(exc),
            )
            self._report(job.id, job.attempts, "lost", exc)
            if here.group is not None:
                self._commit_group(here)  # keep what the group completed before, if it can
        except Exception:  # pragma: no cover - a bug of ours; keep the worker alive
            log.exception("job %d: internal error while running it", job.id)
        return None

    def _execute_fenced(self, job: _Claimed, here: _Thread) -> Future[None] | None:
        """Run one attempt; for an async handler, start it and return its future."""
        fence = {"job_id": job.id, "attempt": job.attempts}
        try:
            task = self.queue.get_task(job.task)
            payload = decode(job.payload)
        except (UnknownTaskError, PayloadError) as exc:
            # No later attempt could do better: straight to dead, with the reason.
            with self._single.connect() as conn:
                conn.execute(statements.bury(), {**fence, "error": error_json(exc)})
            log.error("job %d: %s; moved to dead", job.id, exc)
            if self._observe:
                self._observe.finished(job.run(), "dead", None, exc)
            return None
        is_async = inspect.iscoroutinefunction(task.handler)
        # A slow task runs in a transaction of its own: commit the group before it starts, or
        # the group's row locks would be held for as long as it runs.
        usual = self._durations.get(job.task)
        grouped = not is_async and usual is not None and usual < GROUP_FAST
        if not grouped:
            # ... and give its connection back: a job never holds two connections at once.
            self._commit_group(here)
            self._drop_connection(here)
        # The session is made when the handler first asks for it, and connects when first
        # used: a handler that never touches the database costs no session, no connection and
        # no commit of its own.
        ctx = JobContext(
            job_id=job.id,
            task=job.task,
            queue=job.queue,
            attempt=job.attempts,
            max_attempts=job.max_attempts,
            session=(
                functools.partial(self._group_session, here)
                if grouped
                else functools.partial(HandlerSession, bind=self.engine)
            ),
            async_session=self._async_session if is_async else None,
        )
        run = job.run() if self._observe else None
        if is_async:
            assert self._loop is not None
            return self._loop.submit(self._run_async(job, task, payload, ctx, run, here.lane))
        self._starting(job, task, ctx, run)
        failure: Exception | None = None
        started = time.monotonic()
        try:
            with self._observe.running(run) if run is not None else contextlib.nullcontext():
                task.handler(ctx, payload)
                if ctx.session_used:
                    ctx.session.flush()
        except Exception as exc:
            failure = exc
        self._ran(job, run, time.monotonic() - started)
        if grouped and ctx.session_used:
            self._settle_in_group(job, ctx, task, failure, here)
        else:
            self._settle_outcome(job, task, ctx, failure)
        return None

    def _starting(self, job: _Claimed, task: Task, ctx: JobContext, run: JobRun | None) -> None:
        """Just before a handler starts: arm its timeout, give the heartbeat its context."""
        with self._lock:
            held = self._active.get(job.id)
            if held is not None and held.attempt == job.attempts:
                held.ctx, held.task, held.run = ctx, task, run
                if task.timeout is not None:
                    held.deadline = time.monotonic() + task.timeout.total_seconds()
        if run is not None:
            self._observe.started(run)

    def _ran(self, job: _Claimed, run: JobRun | None, elapsed: float) -> None:
        """Just after a handler returned or raised: note its run time."""
        if run is not None:
            key = (job.id, job.attempts)
            if key in self._timed_out:
                self._timed_out.discard(key)  # its outcome was reported with its timeout
            else:
                self._settling[key] = (run, elapsed)
        usual = self._durations.get(job.task)
        self._durations[job.task] = (
            elapsed if usual is None else usual + DURATION_WEIGHT * (elapsed - usual)
        )

    def _settle_outcome(
        self, job: _Claimed, task: Task, ctx: JobContext, failure: Exception | None
    ) -> None:
        """Record an attempt's outcome, committing its session's writes with a success."""
        fence = {"job_id": job.id, "attempt": job.attempts}
        session = cast(HandlerSession, ctx.session) if ctx.session_used else None
        try:
            if failure is None and (session is None or not session.in_transaction()):
                # Nothing was written through the session: nothing to commit with the
                # completion, which can then go out in a batch with other jobs'.
                assert self._completer is not None
                self._completer.add(job.id, job.attempts)
                return
            # The fenced completion in the handler's own transaction: its writes and the
            # job's success commit together, or (stale attempt, cancel) roll back together.
            if (
                failure is None
                and session is not None
                and session.connection().execute(statements.complete(), fence).rowcount == 1
            ):
                session.commit_for_real()
                self._report(job.id, job.attempts, "succeeded")
                log.debug("job %d (%s) attempt %d succeeded", job.id, job.task, job.attempts)
                return
            if session is not None:
                session.rollback()
        finally:
            if session is not None:
                session.close()
        # The handler's connection is back in the pool before the outcome is recorded, so a
        # job never holds two connections at once.
        if failure is not None:
            self._record_failure(task, job, failure)
            return
        self._not_completed(job.id, job.attempts)

    # -- async handlers, on the event loop ------------------------------------------------

    def _async_session(self) -> AsyncSession:
        from sqlalchemy.ext.asyncio import AsyncSession

        assert self._loop is not None
        # Its sync side is a HandlerSession: commit() only flushes, as for sync handlers.
        return AsyncSession(bind=self._loop.engine(), sync_session_class=HandlerSession)

    async def _run_async(
        self,
        job: _Claimed,
        task: Task,
        payload: Any,
        ctx: JobContext,
        run: JobRun | None,
        lane: _Lane,
    ) -> None:
        """An async handler's attempt, on the event loop: up to the lane's concurrency at once.

        Sync work it cannot avoid (recording a failure) goes to the loop's thread pool, so
        one job's database round trip never stalls the other handlers on the loop.
        """
        if lane.async_slots is None:
            lane.async_slots = asyncio.Semaphore(lane.concurrency)
        try:
            async with lane.async_slots:
                self._starting(job, task, ctx, run)
                failure: Exception | None = None
                started = time.monotonic()
                try:
                    with self._observe.running(run) if run is not None else nullcontext():
                        await supervised(cast(Awaitable[object], task.handler(ctx, payload)), ctx)
                        if ctx.async_session_used:
                            await ctx.async_session.flush()
                except Exception as exc:
                    failure = exc
                self._ran(job, run, time.monotonic() - started)
                await self._settle_async(job, task, ctx, failure)
        except (DBAPIError, psycopg.Error) as exc:
            log.error(
                "job %d: could not record the outcome of attempt %d (%s); it will be"
                " retried after its lease expires",
                job.id,
                job.attempts,
                one_line(exc),
            )
            self._report(job.id, job.attempts, "lost", exc)
        except Exception:  # pragma: no cover - a bug of ours; keep the loop alive
            log.exception("job %d: internal error while running it", job.id)

    async def _settle_async(
        self, job: _Claimed, task: Task, ctx: JobContext, failure: Exception | None
    ) -> None:
        loop = asyncio.get_running_loop()
        session = ctx.async_session if ctx.async_session_used else None
        if session is not None and ctx.session_used:
            failure = failure or RuntimeError(
                "a handler writes through ctx.session or ctx.async_session, not both"
            )
        if session is None or ctx.session_used:
            # No async session, or a sync one beside it: settle as a sync handler's job, on a
            # thread of the loop's pool (a sync session blocks).
            if session is not None:
                await session.rollback()
                await session.close()
            await loop.run_in_executor(None, self._settle_outcome, job, task, ctx, failure)
            return
        fence = {"job_id": job.id, "attempt": job.attempts}
        try:
            if failure is None and not session.in_transaction():
                assert self._completer is not None
                self._completer.add(job.id, job.attempts)
                return
            # The fenced completion in the handler's own transaction, as for a sync handler.
            done = (
                failure is None
                and (
                    cast(CursorResult[Any], await session.execute(statements.complete(), fence))
                ).rowcount
                == 1
            )
            if done:
                await session.run_sync(lambda sync: cast(HandlerSession, sync).commit_for_real())
                self._report(job.id, job.attempts, "succeeded")
                return
            await session.rollback()
        finally:
            await session.close()
        if failure is not None:
            await loop.run_in_executor(None, self._record_failure, task, job, failure)
        else:
            await loop.run_in_executor(None, self._not_completed, job.id, job.attempts)

    def _settle_in_group(
        self,
        job: _Claimed,
        ctx: JobContext,
        task: Task,
        failure: Exception | None,
        here: _Thread,
    ) -> None:
        """A grouped job's outcome: its savepoint joins the group, or is rolled back."""
        session = cast(GroupSession, ctx.session)
        try:
            if failure is None and not ctx.stop_requested:
                # Its completion goes out with the group's; until then its lease is renewed.
                with self._lock:
                    held = self._active.get(job.id)
                    if held is not None and held.attempt == job.attempts:
                        held.grouped, held.ctx, held.deadline = True, None, None
                assert here.group is not None
                here.group.done.append(job)
                return
            session.rollback()
        finally:
            session.close()
        if failure is not None:
            self._record_failure(task, job, failure)
        else:  # it finished after its timeout, its cancellation or the loss of its lease
            self._not_completed(job.id, job.attempts)

    def _fail(self, job_id: int, attempt: int, task: Task, exc: BaseException) -> Row[Any] | None:
        """Record one failed attempt (fenced); the job's new status, or None if it was stale."""
        with self._single.connect() as conn:
            return conn.execute(
                statements.fail(),
                {
                    "job_id": job_id,
                    "attempt": attempt,
                    "delay": task.backoff.delay(attempt).total_seconds(),
                    "error": error_json(exc),
                },
            ).one_or_none()

    def _record_failure(self, task: Task, job: _Claimed, exc: BaseException) -> None:
        if isinstance(exc, Retry | Discard):
            self._control_flow(job, exc)
            return
        row = self._fail(job.id, job.attempts, task, exc)
        outcome = "lost" if row is None else _FAILED_AS.get(row.status, "retried")
        self._report(job.id, job.attempts, outcome, exc)
        if row is None:
            log.warning(
                "job %d: attempt %d failed after losing its lease (or timing out); ignored",
                job.id,
                job.attempts,
            )
        elif row.status == CANCELLED:
            log.info("job %d (%s) was cancelled", job.id, job.task)
        elif row.status == DEAD:
            log.error(
                "job %d (%s) failed on its last attempt (%d/%d), moved to dead: %s",
                job.id,
                job.task,
                job.attempts,
                job.max_attempts,
                one_line(exc),
            )
        else:
            log.info(
                "job %d (%s) attempt %d failed, retrying at %s: %s",
                job.id,
                job.task,
                job.attempts,
                row.visible_at.isoformat(),
                one_line(exc),
            )

    def _control_flow(self, job: _Claimed, exc: Retry | Discard) -> None:
        """A handler asked for its job to run again later (Retry) or never again (Discard)."""
        fence: dict[str, object] = {"job_id": job.id, "attempt": job.attempts}
        with self._single.connect() as conn:
            if isinstance(exc, Retry):
                params = {**fence, "delay": exc.after.total_seconds()}
                row = conn.execute(statements.snooze(), params).one_or_none()
            else:
                params = {**fence, "error": error_json(exc)}
                row = conn.execute(statements.bury(), params).one_or_none()
        if row is None:
            self._report(job.id, job.attempts, "lost", exc)
            log.warning("job %d: attempt %d ended after losing its lease", job.id, job.attempts)
        elif row.status == CANCELLED:
            self._report(job.id, job.attempts, "cancelled", exc)
            log.info("job %d (%s) was cancelled", job.id, job.task)
        elif isinstance(exc, Retry):
            self._report(job.id, job.attempts, "retried", exc)
            log.info("job %d (%s) will run again at %s", job.id, job.task, row.visible_at)
        else:
            self._report(job.id, job.attempts, "dead", exc)
            log.info("job %d (%s) discarded: %s", job.id, job.task, exc.reason)

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
                if not conn.execute(statements.try_prune_lock()).scalar():
                    return total
                deleted = conn.execute(statements.prune(), params).rowcount
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

    # -- heartbeat --------------------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        """Renew the leases of all running jobs in one statement when the first one is due.

        Each job is renewed a third of its lease after its last renewal, so two renewals in a
        row can fail (a slow statement, a brief network blip) before its lease runs out.
        """
        failing = False
        while not self._halt.wait(HEARTBEAT_TICK):
            with self._lock:
                held = dict(self._active)
            now = time.monotonic()
            overdue = [i for i, h in held.items() if h.deadline is not None and h.deadline <= now]
            for job_id in overdue:
                self._time_out(job_id, held.pop(job_id))  # and its lease is renewed no more
            if not any(h.renew_at <= now for h in held.values()):
                continue
            try:
                busy = self._renew(held)
            except Exception as exc:  # keep the heartbeat alive whatever happens
                if not failing:
                    log.warning("lease renewal failed (%s); retrying", one_line(exc))
                failing = True
                # Try again soon, but not on every tick: a tenth of the lease, at least 0.5 s.
                for h in held.values():
                    h.renew_at = now + max(h.lease.total_seconds() / 10, 0.5)
                continue
            if failing:
                log.info("lease renewal works again")
            failing = False
            for job_id, h in held.items():
                # A row locked by someone else for now: try again in a moment.
                wait = HEARTBEAT_RETRY if job_id in busy else h.lease.total_seconds() / 3
                h.renew_at = now + wait

    def _renew(self, held: Mapping[int, _Held]) -> set[int]:
        """Renew these leases; tell the handlers of lost and cancelled jobs to stop.

        Returns the jobs that could not be renewed because another transaction held their
        rows locked for the moment; they are still this worker's, to be renewed again soon.
        """
        ids = list(held)
        params = {"job_ids": ids, "attempt_list": [held[i].attempt for i in ids]}
        with self._single.connect() as conn:
            rows = conn.execute(statements.extend_leases(), params)
            kept = {row.id: row.cancel_requested for row in rows}
            busy: set[int] = set()
            if len(kept) < len(ids):
                busy = set(conn.execute(statements.still_held(), params).scalars()) - set(kept)
        with self._lock:  # jobs that finished meanwhile were simply not renewed
            still = {i for i in ids if self._active.get(i) is held[i]}
        for job_id in still - set(kept) - busy:
            ctx = held[job_id].ctx
            if ctx is not None and not ctx.stop_requested:
                log.warning("job %d lost its lease; asking its handler to stop", job_id)
                ctx._stop = True
                run = held[job_id].run
                if run is not None:
                    self._observe.lease_lost(run)
        for job_id, cancel in kept.items():
            ctx = held[job_id].ctx
            if cancel and ctx is not None and not ctx.cancel_requested:
                log.info("job %d: cancellation requested; asking its handler to stop", job_id)
                ctx._cancel = True
                ctx._stop = True
        return busy

    def _time_out(self, job_id: int, held: _Held) -> None:
        """Record an attempt that ran past its task's timeout as failed, and stop renewing it."""
        with self._lock:
            if self._active.get(job_id) is held:
                del self._active[job_id]
        assert held.task is not None
        assert held.task.timeout is not None
        error = TimeoutError(f"the attempt ran longer than its timeout of {held.task.timeout}")
        # Record the failure before telling the handler: a handler that stops at once would
        # otherwise race to its completion, which would still match the fence and commit.
        try:
            row = self._fail(job_id, held.attempt, held.task, error)
        except Exception as exc:  # the lease then simply runs out and the claim takes over
            log.warning("job %d: could not record its timeout: %s", job_id, one_line(exc))
            return
        finally:
            if held.ctx is not None:
                held.ctx._stop = True
        if row is not None:
            log.warning("job %d timed out on attempt %d; now %s", job_id, held.attempt, row.status)
            if held.run is not None:
                self._timed_out.add((job_id, held.attempt))
                timeout = held.task.timeout.total_seconds()
                outcome = _FAILED_AS.get(row.status, "retried")
                self._observe.finished(held.run, outcome, timeout, error)


def _resolve(future: Future[None], _: object) -> None:
    future.set_result(None)


#: A failed attempt's outcome for observers, from the job's status after the failure.
_FAILED_AS: dict[str, str] = {DEAD: "dead", CANCELLED: "cancelled"}


def _default_queues(queue: JobQueue) -> list[str]:
    names = {task.queue for task in queue.tasks.values()} | {queue.default_queue}
    return sorted(names)
