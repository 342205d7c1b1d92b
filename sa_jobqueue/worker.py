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
import functools
import inspect
import json
import logging
import os
import random
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Awaitable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

import psycopg
from psycopg import sql
from sqlalchemy import Engine, Row
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import Session

from . import statements
from .completions import Completer
from .database import CONNECT_ARGS, check_schema
from .errors import PayloadError, UnknownTaskError
from .models import CANCELLED, DEAD, RUNNING
from .queue import JobQueue
from .tasks import Handler, JobContext, Task

log = logging.getLogger("sa_jobqueue.worker")

#: Longest error message and traceback kept in ``last_error`` (characters). Enough for any
#: useful traceback, small enough that a handler raising a megabyte string cannot bloat rows.
MAX_ERROR_MESSAGE = 2_000
MAX_ERROR_TRACEBACK = 20_000
#: How often the heartbeat thread looks for leases due for renewal (seconds). It only talks to
#: the database when one is due.
HEARTBEAT_TICK = 0.1
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


@dataclass
class _Held:
    """What the heartbeat needs to know about one job this worker is running."""

    attempt: int
    lease: timedelta
    renew_at: float  # time.monotonic() of the next renewal
    ctx: JobContext | None = None
    task: Task | None = None
    deadline: float | None = None  # time.monotonic() when the task's timeout runs out


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
        queues: Iterable[str] | None = None,
        poll_interval: timedelta = timedelta(seconds=1),
        shutdown_grace: timedelta = timedelta(seconds=30),
        listen: bool = True,
        name: str | None = None,
        control_engine: Engine | None = None,
        prefetch: int | None = None,
        retention: timedelta | None = timedelta(days=1),
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if prefetch is not None and prefetch < 0:
            raise ValueError("prefetch must not be negative")
        self.queue = queue
        self.engine = engine
        self.concurrency = concurrency
        # Jobs claimed ahead of free threads, so that one claim brings a batch: the worker
        # claims again when its buffer has run dry, up to concurrency + prefetch jobs. Left
        # unset, the buffer adapts: it doubles while jobs drain it within PREFETCH_FAST (short
        # jobs: fewer, larger claims) and halves while they take longer than PREFETCH_SLOW
        # (long jobs: do not sit on work another worker could start).
        self._adaptive = prefetch is None
        self.prefetch = concurrency if prefetch is None else prefetch
        self._max_prefetch = PREFETCH_MAX_FACTOR * concurrency
        self._filled_at = 0.0  # time.monotonic() of the last claim that filled the buffer
        if retention is not None and retention < timedelta(0):
            raise ValueError("retention must not be negative")
        self.retention = retention
        self._next_prune = 0.0  # time.monotonic() of the next pruning round
        self.queues = list(queues) if queues else _default_queues(queue)
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
        self._completer: Completer | None = None
        self._saturated = False
        self._burst = False
        self._rotation = 0

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
        pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="sa_jobqueue-job")
        self._completer = Completer(self._single, self._not_completed)
        helpers = [
            threading.Thread(target=self._heartbeat_loop, name="sa_jobqueue-heartbeat", daemon=True)
        ]
        if self.listen:
            helpers.append(
                threading.Thread(target=self._listen_loop, name="sa_jobqueue-listener", daemon=True)
            )
        for thread in helpers:
            thread.start()
        try:
            self._claim_loop(pool, burst)
        finally:
            self._stopping.set()
            self._release_unstarted()
            with self._lock:
                pending = set(self._futures)
            _, not_done = wait_futures(pending, timeout=self.shutdown_grace.total_seconds())
            self._completer.close()
            # Jobs still running past the grace keep their threads (Python cannot kill them),
            # but their leases are no longer renewed, so another worker will take them over.
            self._halt.set()
            pool.shutdown(wait=not not_done, cancel_futures=True)
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

    def _claim_loop(self, pool: ThreadPoolExecutor, burst: bool) -> None:
        self._burst = burst
        outage = 0  # claims failed in a row
        while not self._stopping.is_set():
            # Clear before claiming: a NOTIFY that lands after the claim's snapshot sets the
            # event again and the wait below returns at once, so no wake-up is lost.
            self._wake.clear()
            self._maybe_prune()
            try:
                more = self._claim_round(pool)
            except SQLAlchemyError as exc:  # the server, the network, or a pool time-out
                # Said once per outage, not once per try.
                if not outage:
                    log.warning("cannot claim (%s); retrying", _one_line(exc))
                outage += 1
                more = False
            else:
                if outage:
                    log.info("claiming again: the database is back")
                outage = 0
            with self._lock:
                running = len(self._futures)
            if more and running < self.capacity:
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
    def capacity(self) -> int:
        """Jobs this worker holds at most: running, plus claimed and waiting for a thread."""
        return self.concurrency + self.prefetch

    def _adapt_prefetch(self) -> None:
        if not self._adaptive or not self._filled_at:
            return
        drained_in = time.monotonic() - self._filled_at
        if drained_in < PREFETCH_FAST:
            self.prefetch = min(max(self.prefetch * 2, 1), self._max_prefetch)
        elif drained_in > PREFETCH_SLOW:
            self.prefetch = max(self.prefetch // 2, 1)

    def _claim_round(self, pool: ThreadPoolExecutor) -> bool:
        """Claim into the free slots, queue by queue. True if more work is probably waiting.

        "Probably waiting" means a claim returned as many jobs as it asked for, or a queue was
        not asked at all because the slots ran out first.
        """
        # Only a round that starts once the buffer has run dry says how fast jobs drain it; a
        # NOTIFY or a poll that arrives while the buffer is still full says nothing.
        if len(self._futures) <= self.concurrency:
            self._adapt_prefetch()
            self._filled_at = 0.0
        n = len(self.queues)
        start, self._rotation = self._rotation, (self._rotation + 1) % n
        more = False
        for queue in (self.queues[(start + i) % n] for i in range(n)):
            free = self.capacity - len(self._futures)
            if free <= 0:
                more = True
                break
            with self._single.connect() as conn:
                rows = conn.execute(
                    statements.claim(), {"from_queue": queue, "limit": free, "worker": self.name}
                ).all()
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
                self._submit(pool, job)
        if more and not self._filled_at:
            self._filled_at = time.monotonic()
        with self._lock:
            # Tell _finished whether a freed slot is worth waking the claim loop for.
            self._saturated = more
        return more

    def _submit(self, pool: ThreadPoolExecutor, job: _Claimed) -> None:
        with self._lock:
            self._active[job.id] = _Held(
                job.attempts, job.lease, time.monotonic() + job.lease.total_seconds() / 3
            )
            future = pool.submit(self._execute, job)
            self._futures[future] = job
        future.add_done_callback(
            functools.partial(self._finished, job_id=job.id, attempt=job.attempts)
        )

    def _finished(self, future: Future[None], job_id: int, attempt: int) -> None:
        with self._lock:
            self._futures.pop(future, None)
            # A timed-out attempt that ran on can finish after this worker claimed the job's
            # next attempt: leave that one registered, or it would never be renewed.
            held = self._active.get(job_id)
            if held is not None and held.attempt == attempt:
                del self._active[job_id]
            # A freed slot only matters if the last claim left work behind, and then once the
            # buffer of claimed jobs has run dry, so the next claim brings a batch. In burst
            # mode the loop also needs to notice when the last job is done.
            wake = self._burst or (self._saturated and len(self._futures) <= self.concurrency)
            if wake:
                self._saturated = False
        if wake:
            self._wake.set()

    def _release_unstarted(self) -> None:
        """On shutdown, hand the claimed jobs no thread has started back, attempt uncounted."""
        with self._lock:
            waiting = list(self._futures.items())
        # Future.cancel() runs the done callback (which takes the lock) in this thread, and
        # succeeds only for a job whose handler has not started.
        unstarted = [job for future, job in waiting if future.cancel()]
        if not unstarted:
            return
        try:
            with self._single.connect() as conn:
                released = conn.execute(
                    statements.release(),
                    {
                        "job_ids": [job.id for job in unstarted],
                        "attempt_list": [job.attempts for job in unstarted],
                    },
                ).all()
        except DBAPIError as exc:
            log.warning(
                "could not hand back %d unstarted job(s) (%s); they will be reclaimed when"
                " their leases expire",
                len(unstarted),
                _one_line(exc),
            )
            return
        log.info("handed back %d claimed job(s) that had not started", len(released))

    def _not_completed(self, job_id: int, attempt: int) -> None:
        """A completion matched no row: the job was cancelled, or the attempt is stale (its
        lease was lost or it timed out). Either way its writes were rolled back."""
        with self._single.connect() as conn:
            fence = {"job_id": job_id, "attempt": attempt}
            cancelled = conn.execute(statements.finish_cancelled(), fence).rowcount == 1
        if cancelled:
            log.info("job %d was cancelled", job_id)
        else:
            log.warning(
                "job %d: attempt %d lost its lease (or timed out) before completing",
                job_id,
                attempt,
            )

    # -- running one job --------------------------------------------------------------------

    def _execute(self, job: _Claimed) -> None:
        try:
            self._execute_fenced(job)
        except DBAPIError as exc:
            # The outcome could not be recorded (connection lost, server gone). The job stays
            # running in the database and is reclaimed when its lease runs out.
            log.error(
                "job %d: could not record the outcome of attempt %d (%s); it will be"
                " retried after its lease expires",
                job.id,
                job.attempts,
                _one_line(exc),
            )
        except Exception:  # pragma: no cover - a bug of ours; keep the worker alive
            log.exception("job %d: internal error while running it", job.id)

    def _execute_fenced(self, job: _Claimed) -> None:
        fence = {"job_id": job.id, "attempt": job.attempts}
        try:
            task = self.queue.get_task(job.task)
            payload = _decode(job.payload)
        except (UnknownTaskError, PayloadError) as exc:
            # No later attempt could do better: straight to dead, with the reason.
            with self._single.connect() as conn:
                conn.execute(statements.bury(), {**fence, "error": _error_json(exc)})
            log.error("job %d: %s; moved to dead", job.id, exc)
            return
        # The session is made when the handler first asks for it, and connects when first
        # used: a handler that never touches the database costs no session, no connection and
        # no commit of its own.
        ctx = JobContext(
            job_id=job.id,
            task=job.task,
            queue=job.queue,
            attempt=job.attempts,
            max_attempts=job.max_attempts,
            session=functools.partial(HandlerSession, bind=self.engine),
        )
        with self._lock:
            held = self._active.get(job.id)
            if held is not None and held.attempt == job.attempts:
                held.ctx, held.task = ctx, task
                if task.timeout is not None:
                    held.deadline = time.monotonic() + task.timeout.total_seconds()
        failure: Exception | None = None
        try:
            if inspect.iscoroutinefunction(task.handler):
                _run_coroutine(task.handler, ctx, payload)
            else:
                task.handler(ctx, payload)
            if ctx.session_used:
                ctx.session.flush()
        except Exception as exc:
            failure = exc
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

    def _fail(self, job_id: int, attempt: int, task: Task, exc: BaseException) -> Row[Any] | None:
        """Record one failed attempt (fenced); the job's new status, or None if it was stale."""
        with self._single.connect() as conn:
            return conn.execute(
                statements.fail(),
                {
                    "job_id": job_id,
                    "attempt": attempt,
                    "delay": task.backoff.delay(attempt).total_seconds(),
                    "error": _error_json(exc),
                },
            ).one_or_none()

    def _record_failure(self, task: Task, job: _Claimed, exc: BaseException) -> None:
        row = self._fail(job.id, job.attempts, task, exc)
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
                _one_line(exc),
            )
        else:
            log.info(
                "job %d (%s) attempt %d failed, retrying at %s: %s",
                job.id,
                job.task,
                job.attempts,
                row.visible_at.isoformat(),
                _one_line(exc),
            )

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
            log.warning("pruning failed: %s", _one_line(exc))
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
                self._renew(held)
            except Exception as exc:  # keep the heartbeat alive whatever happens
                if not failing:
                    log.warning("lease renewal failed (%s); retrying", _one_line(exc))
                failing = True
                # Try again soon, but not on every tick: a tenth of the lease, at least 0.5 s.
                for h in held.values():
                    h.renew_at = now + max(h.lease.total_seconds() / 10, 0.5)
                continue
            if failing:
                log.info("lease renewal works again")
            failing = False
            for h in held.values():
                h.renew_at = now + h.lease.total_seconds() / 3

    def _renew(self, held: Mapping[int, _Held]) -> None:
        ids = list(held)
        with self._single.connect() as conn:
            rows = conn.execute(
                statements.extend_leases(),
                {"job_ids": ids, "attempt_list": [held[i].attempt for i in ids]},
            )
            kept = {row.id: row.cancel_requested for row in rows}
        with self._lock:  # jobs that finished meanwhile were simply not renewed
            still = {i for i in ids if self._active.get(i) is held[i]}
        for job_id in still - set(kept):
            ctx = held[job_id].ctx
            if ctx is not None and not ctx.stop_requested:
                log.warning("job %d lost its lease; asking its handler to stop", job_id)
                ctx._stop = True
        for job_id, cancel in kept.items():
            ctx = held[job_id].ctx
            if cancel and ctx is not None and not ctx.cancel_requested:
                log.info("job %d: cancellation requested; asking its handler to stop", job_id)
                ctx._cancel = True
                ctx._stop = True

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
            log.warning("job %d: could not record its timeout: %s", job_id, _one_line(exc))
            return
        finally:
            if held.ctx is not None:
                held.ctx._stop = True
        if row is not None:
            log.warning("job %d timed out on attempt %d; now %s", job_id, held.attempt, row.status)

    # -- listener ---------------------------------------------------------------------------

    def _listen_loop(self) -> None:
        """Hold one LISTEN connection; reconnect after any failure and poll straight away."""
        failures = 0
        while not self._stopping.is_set():
            try:
                cargs, cparams = self.engine.dialect.create_connect_args(self.engine.url)
                cparams = {**CONNECT_ARGS, **cparams}
                with psycopg.connect(*cargs, **cparams, autocommit=True) as raw:
                    raw.execute(sql.SQL("LISTEN {}").format(sql.Identifier(statements.CHANNEL)))
                    if failures:
                        log.info("listener reconnected")
                    failures = 0
                    # Jobs enqueued while we were not listening sent their NOTIFY to nobody.
                    self._wake.set()
                    while not self._stopping.is_set():
                        for note in raw.notifies(timeout=0.5):
                            if note.payload in self.queues:
                                self._wake.set()
            except Exception as exc:
                if failures == 0:
                    log.warning("listener connection lost (%s); reconnecting", _one_line(exc))
                failures += 1
                self._stopping.wait(min(0.1 * 2**failures, 5.0))


class HandlerSession(Session):
    """The Session a handler gets: ``commit()`` only flushes.

    The worker commits the session's transaction together with the job's fenced completion; a
    handler committing on its own would let its writes through even when its attempt has lost
    its lease. ``rollback()`` works as usual.
    """

    def commit(self) -> None:
        """Flush, and leave committing to the worker."""
        self.flush()

    def commit_for_real(self) -> None:
        Session.commit(self)


class AttemptStopped(Exception):
    """The worker cancelled an async handler (timeout, cancellation or lost lease)."""


#: How often an async handler's stop flag is checked (seconds).
ASYNC_STOP_CHECK = 0.05


def _run_coroutine(handler: Handler, ctx: JobContext, payload: Any) -> None:
    """Run an ``async def`` handler on an event loop of its own in this job thread.

    Unlike a sync handler, it is really stopped: once ``ctx.stop_requested`` turns True
    (timeout, cancellation, lost lease) its task is cancelled at its next ``await``.
    """

    async def supervise() -> None:
        job = asyncio.ensure_future(cast(Awaitable[object], handler(ctx, payload)))
        while not job.done():
            if ctx.stop_requested:
                job.cancel()
                break
            await asyncio.wait({job}, timeout=ASYNC_STOP_CHECK)
        try:
            await job
        except asyncio.CancelledError:
            raise AttemptStopped("the worker cancelled this attempt") from None

    asyncio.run(supervise())


def _decode(payload: str) -> Any:
    try:
        return json.loads(payload)
    except (ValueError, RecursionError) as exc:
        raise PayloadError(f"the payload could not be decoded: {type(exc).__name__}") from exc


def _default_queues(queue: JobQueue) -> list[str]:
    names = {task.queue for task in queue.tasks.values()} | {queue.default_queue}
    return sorted(names)


def _one_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return (text.splitlines() or [type(exc).__name__])[0][:300]


def _clean(text: str, limit: int) -> str:
    # PostgreSQL text cannot hold NUL, and lone surrogates cannot be encoded as UTF-8.
    text = text.replace("\x00", "\N{REPLACEMENT CHARACTER}")
    text = text.encode("utf-8", "replace").decode("utf-8")
    if len(text) > limit:
        text = text[:limit] + f"... [{len(text) - limit} more characters]"
    return text


def _error_json(exc: BaseException) -> str:
    kind = type(exc)
    try:
        message = str(exc)
    except Exception:  # a broken __str__ must not stop us recording the failure
        message = f"<unprintable {kind.__name__}>"
    return json.dumps(
        {
            "type": f"{kind.__module__}.{kind.__qualname__}",
            "message": _clean(message, MAX_ERROR_MESSAGE),
            "traceback": _clean("".join(traceback.format_exception(exc)), MAX_ERROR_TRACEBACK),
        }
    )
