"""Running claimed jobs: job threads, shared transactions, the event loop, outcomes."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import threading
import time
from collections.abc import Awaitable
from concurrent.futures import Future
from contextlib import nullcontext
from dataclasses import dataclass, field
from queue import Empty
from typing import TYPE_CHECKING, Any, cast

import psycopg
from psycopg.pq import TransactionStatus
from sqlalchemy import Connection, CursorResult, Engine, RootTransaction, Row
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import Session

from ._deadlines import DEADLINES
from ._error_text import error_json, one_line
from ._sql import transitions
from .attempts import FAILED_AS, Claimed, Held, Lane, policy
from .completions import Completer
from .errors import PayloadError, UnknownTaskError
from .execution import EventLoopThread, GroupSession, HandlerSession, decode, supervised
from .models import CANCELLED, DEAD
from .observability import JobRun, Observers
from .queue import JobQueue
from .tasks import Backoff, Discard, JobContext, Retry, Task

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

log = logging.getLogger("sa_jobqueue.worker")

#: Jobs that write through their session share one transaction, a savepoint each, with the
#: jobs their thread runs right after them, so that many jobs cost one commit (one fsync) and
#: one completing statement instead of one each. Only tasks whose handlers recently ran faster
#: than GROUP_FAST seconds (a moving average) join a group: for them the commit is a large part
#: of the cost, and a group of them holds its handlers' row locks only briefly. A group commits when
#: it has GROUP_MAX_JOBS jobs, is GROUP_MAX_AGE seconds old, its thread finds no job waiting
#: for GROUP_IDLE seconds, or a slower task is next. GROUP_MAX_JOBS stays below 64: each job's
#: savepoint that writes takes a subtransaction id, and past 64 in one transaction PostgreSQL
#: overflows its per-backend cache of them, which slows every other session's snapshots.
GROUP_FAST = 0.02
GROUP_MAX_JOBS = 50
GROUP_MAX_AGE = 0.05
GROUP_IDLE = 0.001
#: Weight of the newest run in a task's moving average of run times.
DURATION_WEIGHT = 0.2


@dataclass
class _Group:
    """A job thread's open transaction, shared by the fast writing jobs it runs in a row."""

    conn: Connection
    tx: RootTransaction
    opened: float = field(default_factory=time.monotonic)
    done: list[Claimed] = field(default_factory=list)  # succeeded, completion pending

    @property
    def intact(self) -> bool:
        """The shared transaction is still the connection's, and still open.

        A job's savepoint protects the others only from what happens inside it; should
        anything ever end the shared transaction itself, the jobs it held lost their writes
        and must not be completed (see :meth:`JobRunner._commit_group`)."""
        return (
            self.tx.is_active and self.conn.get_transaction() is self.tx and not _aborted(self.conn)
        )

    @property
    def due(self) -> bool:
        return len(self.done) >= GROUP_MAX_JOBS or time.monotonic() - self.opened >= GROUP_MAX_AGE


def _deadline(conn: Connection) -> contextlib.AbstractContextManager[None]:
    """The worker's client-side deadline for its completion on a handler's connection."""
    return DEADLINES.guard(conn.connection.dbapi_connection)


def _aborted(conn: Connection) -> bool:
    """Whether the connection's transaction is in error: only a rollback is accepted now."""
    driver = conn.connection.driver_connection
    return bool(driver is not None and driver.info.transaction_status == TransactionStatus.INERROR)


class SwallowedError(Exception):
    """A handler went on after one of its statements failed, without ``rollback()``."""


class ThreadState:
    """What one job thread carries from job to job: its open group and its connection."""

    __slots__ = ("conn", "group", "lane")

    def __init__(self, lane: Lane) -> None:
        self.lane = lane
        self.group: _Group | None = None
        self.conn: Connection | None = None  # kept between groups while work is waiting


class JobRunner:
    """Running claimed jobs and recording their outcomes: the half of :class:`Worker` that
    runs on job threads (and the event loop), apart from the claim loop that feeds it."""

    # Set by Worker.__init__.
    engine: Engine
    queue: JobQueue
    _single: Engine
    _lock: threading.Lock
    _active: dict[int, Held]
    _completer: Completer | None
    _loop: EventLoopThread | None
    _observe: Observers
    _settling: dict[tuple[int, int], tuple[JobRun, float | None]]
    _timed_out: set[tuple[int, int]]
    _durations: dict[str, float]
    _groups_open: int  # groups whose commit is still to come (a burst waits for them)
    _burst: bool
    _wake: threading.Event
    _stopping: threading.Event

    def _hand_back(self, jobs: list[Claimed], why: str) -> None:
        """Return attempts to the queue as if never claimed (fenced): due again at once."""
        try:
            with self._single.connect() as conn:
                released = conn.execute(
                    transitions.release(),
                    {
                        "job_ids": [job.id for job in jobs],
                        "attempt_list": [job.attempts for job in jobs],
                    },
                ).all()
        except SQLAlchemyError as exc:
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
        try:
            with self._single.connect() as conn:
                fence = {"job_id": job_id, "attempt": attempt}
                cancelled = conn.execute(transitions.finish_cancelled(), fence).rowcount == 1
        except SQLAlchemyError as exc:  # the job stays as it is; its lease settles it
            log.warning("job %d: could not settle attempt %d: %s", job_id, attempt, one_line(exc))
            self._report(job_id, attempt, "lost", exc)
            return
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

    def _job_thread(self, lane: Lane) -> None:
        """Run a lane's claimed jobs one after another until told to finish."""
        here = ThreadState(lane)
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

    def _commit_group(self, here: ThreadState) -> None:
        """Complete the group's jobs in one fenced statement and commit their work with it.

        If any of them can no longer complete (cancelled, or its lease lost), the whole
        group rolls back: the others are handed back to the queue to run again (their
        writes were rolled back with the rest), which is rare enough to cost nothing. Never
        raises: a job thread must outlive any trouble its group meets.
        """
        group, here.group = here.group, None
        if group is None:
            return
        try:
            self._end_group(here, group)
        except Exception:  # pragma: no cover - a bug of ours; the leases settle the jobs
            log.exception("internal error while committing %d job(s)", len(group.done))
        finally:
            with self._lock:
                self._groups_open -= 1
            if self._burst:
                self._wake.set()  # a burst ends only once no group is open

    def _end_group(self, here: ThreadState, group: _Group) -> None:
        jobs = group.done
        if not group.intact:
            # Something ended the shared transaction early: its jobs' writes are gone, so
            # they must not be completed. They go back to the queue, to run again.
            self._drop_connection(here)
            self._settle(jobs)
            if jobs:
                self._hand_back(jobs, "their shared transaction ended early")
                for job in jobs:
                    self._report(job.id, job.attempts, "handed_back")
            return
        try:
            done: set[int] = set()
            with _deadline(group.conn):
                if jobs:
                    done = set(
                        group.conn.execute(
                            transitions.complete_many(),
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

    def _settle(self, jobs: list[Claimed]) -> None:
        """Forget the leases of a group's jobs once it has committed or rolled back."""
        with self._lock:
            for job in jobs:
                held = self._active.get(job.id)
                if held is not None and held.attempt == job.attempts:
                    del self._active[job.id]

    def _drop_connection(self, here: ThreadState) -> None:
        conn, here.conn = here.conn, None
        if conn is not None:
            conn.close()

    def _group_session(self, here: ThreadState) -> Session:
        if here.group is not None and not here.group.intact:
            self._commit_group(here)  # hands its jobs back: it cannot commit them any more
        if here.group is None:
            if here.conn is None:
                here.conn = self.engine.connect()
            here.group = _Group(here.conn, here.conn.begin())
            with self._lock:
                self._groups_open += 1
        return GroupSession(here.group.conn)

    def _execute(self, job: Claimed, here: ThreadState) -> Future[None] | None:
        try:
            return self._execute_fenced(job, here)
        except (DBAPIError, psycopg.Error) as exc:  # psycopg's own: a group's savepoints
            self._unrecorded_outcome(job, exc)
            if here.group is not None:
                self._commit_group(here)  # keep what the group completed before, if it can
        except Exception:  # pragma: no cover - a bug of ours; keep the worker alive
            log.exception("job %d: internal error while running it", job.id)
        return None

    def _unrecorded_outcome(self, job: Claimed, exc: Exception) -> None:
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

    def _execute_fenced(self, job: Claimed, here: ThreadState) -> Future[None] | None:
        """Run one attempt; for an async handler, start it and return its future."""
        fence = {"job_id": job.id, "attempt": job.attempts}
        try:
            task = self.queue.get_task(job.task)
            payload = decode(job.payload)
        except (UnknownTaskError, PayloadError) as exc:
            # No later attempt could do better: straight to dead, with the reason.
            with self._single.connect() as conn:
                conn.execute(transitions.bury(), {**fence, "error": error_json(exc)})
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

    def _starting(self, job: Claimed, task: Task, ctx: JobContext, run: JobRun | None) -> None:
        """Just before a handler starts: arm its timeout, give the heartbeat its context."""
        with self._lock:
            held = self._active.get(job.id)
            if held is not None and held.attempt == job.attempts:
                held.ctx, held.task, held.run = ctx, task, run
                held.backoff = policy(job, task)
                if task.timeout is not None:
                    held.deadline = time.monotonic() + task.timeout.total_seconds()
        if run is not None:
            self._observe.started(run)

    def _ran(self, job: Claimed, run: JobRun | None, elapsed: float) -> None:
        """Just after a handler returned or raised: note its run time."""
        if run is not None:
            key = (job.id, job.attempts)
            with self._lock:  # against the heartbeat's _time_out, which may report it first
                if key in self._timed_out:
                    self._timed_out.discard(key)  # its outcome was reported with its timeout
                else:
                    self._settling[key] = (run, elapsed)
        usual = self._durations.get(job.task)
        self._durations[job.task] = (
            elapsed if usual is None else usual + DURATION_WEIGHT * (elapsed - usual)
        )

    def _settle_outcome(
        self, job: Claimed, task: Task, ctx: JobContext, failure: Exception | None
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
            if failure is None and session is not None:
                conn = session.connection()
                with _deadline(conn):
                    done = conn.execute(transitions.complete(), fence).rowcount == 1
                    if done:
                        session.commit_for_real()
                if done:
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
        job: Claimed,
        task: Task,
        payload: Any,
        ctx: JobContext,
        run: JobRun | None,
        lane: Lane,
    ) -> None:
        """An async handler's attempt, on the event loop: up to the lane's concurrency at once.

        Sync work it cannot avoid (recording a failure) goes to the loop's thread pool, so
        one job's database round trip never stalls the other handlers on the loop.
        """
        if lane.async_slots is None:
            lane.async_slots = asyncio.Semaphore(lane.concurrency)
        try:
            async with lane.async_slots:
                if self._stopping.is_set():
                    # Shutting down before it could start: back to the queue uncounted, as
                    # a buffered sync job is.
                    loop = asyncio.get_running_loop()
                    await loop.run_in_executor(None, self._hand_back, [job], "not started")
                    return
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
            self._unrecorded_outcome(job, exc)
        except Exception:  # pragma: no cover - a bug of ours; keep the loop alive
            log.exception("job %d: internal error while running it", job.id)

    async def _settle_async(
        self, job: Claimed, task: Task, ctx: JobContext, failure: Exception | None
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
                    cast(CursorResult[Any], await session.execute(transitions.complete(), fence))
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
        job: Claimed,
        ctx: JobContext,
        task: Task,
        failure: Exception | None,
        here: ThreadState,
    ) -> None:
        """A grouped job's outcome: its savepoint joins the group, or is rolled back."""
        session = cast(GroupSession, ctx.session)
        try:
            assert here.group is not None
            if failure is None and not ctx.stop_requested and _aborted(here.group.conn):
                # A statement failed and the handler swallowed the error without rolling back:
                # its savepoint cannot be released, and its job fails like one that raised.
                failure = SwallowedError(
                    "a statement failed in the handler, which went on without rollback()"
                )
            if failure is None and not ctx.stop_requested:
                try:
                    session.commit_for_real()  # RELEASE SAVEPOINT: its writes join the group's
                except SQLAlchemyError as exc:
                    failure = exc
                else:
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

    def _fail(
        self, job_id: int, attempt: int, backoff: Backoff, exc: BaseException
    ) -> Row[Any] | None:
        """Record one failed attempt (fenced); the job's new status, or None if it was stale."""
        with self._single.connect() as conn:
            return conn.execute(
                transitions.fail(),
                {
                    "job_id": job_id,
                    "attempt": attempt,
                    "delay": backoff.delay(attempt).total_seconds(),
                    "error": error_json(exc),
                },
            ).one_or_none()

    def _record_failure(self, task: Task, job: Claimed, exc: BaseException) -> None:
        if isinstance(exc, Retry | Discard):
            self._control_flow(job, exc)
            return
        row = self._fail(job.id, job.attempts, policy(job, task), exc)
        outcome = "lost" if row is None else FAILED_AS.get(row.status, "retried")
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

    def _control_flow(self, job: Claimed, exc: Retry | Discard) -> None:
        """A handler asked for its job to run again later (Retry) or never again (Discard)."""
        fence: dict[str, object] = {"job_id": job.id, "attempt": job.attempts}
        with self._single.connect() as conn:
            if isinstance(exc, Retry):
                params = {**fence, "delay": exc.after.total_seconds()}
                row = conn.execute(transitions.snooze(), params).one_or_none()
            else:
                params = {**fence, "error": error_json(exc)}
                row = conn.execute(transitions.bury(), params).one_or_none()
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


def resolve(future: Future[None], _: object) -> None:
    future.set_result(None)
