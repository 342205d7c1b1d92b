"""Batch tasks: forming a batch around a claimed job, running it, settling its jobs together.

A job thread that takes a job of a batch task (the leader) claims more of the task's due jobs
(:meth:`Batches._fill`, with ``claim_limits.claim_limited(batch=True)``: the rules of the
queue's claim, restricted to the batch; one such claim at a time in a process), registers
each in the lease table (renewed, counted in the lane) and commits that claim before the
handler runs, so every member's attempt is counted even if the process dies next. It fills
again, on a short poll, until the batch is full or ``max_wait`` has passed since it started (a
burst does not wait: it runs what is due).

Settling: the jobs the handler did not mark are completed in one fenced statement in the
batch's own transaction, which then commits with what the handler wrote; if that statement
completes fewer jobs than it names (one lost its lease, was cancelled, timed out), the whole
transaction rolls back, the stale attempts are settled as such and the others handed back to
run again, as a group's are (see ``_groups``). A raising handler fails every member, each
under its own policy. Jobs the handler marked are recorded, each with its own verdict, after
the batch committed.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import threading
import time
from collections.abc import Awaitable, Coroutine
from typing import TYPE_CHECKING, Any, cast

import psycopg
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from .._sql import claim_limits
from ..batching import BatchContext, BatchJob
from ..database import HeldConnection
from ..errors import AttemptStoppedError, JobQueueError, PayloadError, UnstorableResultError
from ..middleware import arun_chain, run_chain
from ..queue import JobQueue
from ..tasks import JobContext, Task
from ._attempt import Pipeline
from ._claimed import Claimed
from ._claimer import runnable
from ._event_loop import ASYNC_STOP_CHECK, EventLoopThread
from ._lanes import Lane
from ._leases import LeaseTable, Ticket
from ._recorder import Recorder
from ._sessions import HandlerSession, deadline, decode, handler_session
from ._settlement import BOTH_SESSIONS, settle, shutting_down

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

log = logging.getLogger("sa_jobqueue.worker")

#: How often a batch that is not full claims again while it waits for more jobs (seconds),
#: at most: a job enqueued meanwhile joins within this, and an idle batch task costs one
#: small claim per 20 ms of its ``max_wait``.
FILL_POLL = 0.02


class Batches:
    """Forms, runs and settles the batches of batch tasks, on the job thread of their leader.

    What it does not promise: that a batch is full, nor that it commits (see
    :class:`~sa_jobqueue.batching.BatchContext`).
    """

    def __init__(
        self,
        queue: JobQueue,
        engine: Engine,
        single: Engine,
        leases: LeaseTable,
        recorder: Recorder,
        pipeline: Pipeline,
        *,
        worker: str,
        loop: EventLoopThread | None,
        stopping: threading.Event,
        wake: threading.Event,
    ) -> None:
        self._queue = queue
        self._engine = engine
        self._single = single
        self._leases = leases
        self._recorder = recorder
        self._pipeline = pipeline
        self._worker = worker
        self._loop = loop
        self._stopping = stopping
        self._wake = wake
        # Per queue: whether its claim needs the variant with limits per key (learnt from the
        # claim's own answer, as the claimer's LimitedQueues learns it).
        self._keyed: dict[str, bool] = {}
        self.tasks = frozenset(name for name, t in queue.tasks.items() if t.batching is not None)
        # One fill claim at a time in this process: each job thread that takes a job of a
        # batch task leads a batch and fills it from the head of the queue, and with every
        # thread filling at once, fills of many processes collided there (each skipping the
        # rows the others had locked, and locking rows another had just claimed, which held
        # up that batch's completion). Taking turns, a process's fills are as large and no
        # more numerous: 1.7 to 1.9 times the batch-writing drain at 8 and 16 processes.
        self._filling = threading.Lock()

    # -- forming -------------------------------------------------------------------------------

    def run(self, leader: Claimed, lane: Lane) -> None:
        """Form a batch around ``leader`` (taken by this thread), run it and settle it.

        Never raises: the thread goes on whatever the batch met. The leader's ticket is its
        caller's to let go; the tickets of the members claimed here are let go here.
        """
        task = self._queue.get_task(leader.task)
        tickets: list[Ticket] = []
        members = [leader]
        # The batch's claims share one connection (no checkout, no pre-ping per claim).
        conn = HeldConnection(self._single)
        try:
            try:
                self._fill(leader, task, lane, tickets, members, conn)
            finally:
                conn.close()
            self._run(task, members)
        except (SQLAlchemyError, psycopg.Error) as exc:
            # Most likely a connection lost: what was not recorded is left to the fence, the
            # leases ended so that the jobs run again at once.
            self._recorder.unrecorded(members, exc)
        except Exception:  # pragma: no cover - a bug of ours; the leases settle the jobs
            log.exception("batch of %d job(s) of %s: internal error", len(members), task.name)
        finally:
            if self._leases.let_go_many(tickets):
                self._wake.set()

    def _fill(
        self,
        leader: Claimed,
        task: Task,
        lane: Lane,
        tickets: list[Ticket],
        found: list[Claimed],
        conn: HeldConnection,
    ) -> None:
        """Claim more jobs of the leader's batch into ``found`` (which holds the leader) until
        it is full or its wait is over; each is in ``found`` as soon as it is claimed, so that
        an error later on leaves none of them unaccounted for."""
        batching = task.batching
        assert batching is not None
        until = time.monotonic() + batching.max_wait.total_seconds()
        params: dict[str, Any] = {
            "from_queue": leader.queue,
            "worker": self._worker,
            "batch_task": leader.task,
            "batch_key_field": batching.batch_key,
            "batch_leader": leader.id,
        }
        while len(found) < batching.max_size and not self._stopping.is_set():
            params["limit"] = batching.max_size - len(found)
            keyed = self._keyed.get(leader.queue, False)
            # As text, to the driver: its rows are read as the plain claim's are, without
            # SQLAlchemy's processing of each of up to max_size rows.
            statement = claim_limits.claim_limited(keyed=keyed, batch=True)
            with self._filling:
                rows = conn.rows(statement, params, as_text=True)
            if rows[0].keyed is not None and bool(rows[0].keyed) != keyed:
                self._keyed[leader.queue] = bool(rows[0].keyed)  # its limits per key changed
            # Not limited_jobs(): a member's completion is the batch's, never a batched one
            # that waits to free its slot (what ``holds_slot`` is for).
            claimed = Claimed.of_rows([r for r in rows if r.id is not None])
            jobs = [job for job in claimed if runnable(job)]
            tickets += self._leases.hold_running(lane, jobs)
            _take_over(found, claimed, jobs)
            if rows[0].keyed is not None and bool(rows[0].keyed) != keyed:
                continue  # claimed with the variant the queue's limits need, at once
            left = until - time.monotonic()
            if left <= 0 or self._leases.burst or len(found) >= batching.max_size:
                break
            self._stopping.wait(min(FILL_POLL, left))

    # -- running -------------------------------------------------------------------------------

    def _run(self, task: Task, members: list[Claimed]) -> None:
        """Run the batch's handler once, and settle every member."""
        jobs: list[BatchJob[Any]] = []
        ready: list[Claimed] = []
        for job, payload in zip(members, _decoded(members), strict=True):
            if isinstance(payload, PayloadError):
                self._recorder.unrunnable(job, payload)  # as for a single job: dead at once
                continue
            if task.payload_codec is not None:
                try:
                    payload = task.payload_codec.rebuild(payload)
                except PayloadError as exc:  # no longer fits its type: this job fails alone
                    self._recorder.record(job, settle(exc, wrote=False), task)
                    continue
            assert job.created_at is not None
            jobs.append(
                BatchJob(
                    job.id, payload, job.attempts, job.max_attempts, job.created_at, job.priority
                )
            )
            ready.append(job)
        if not ready:
            return
        # One context shared by the batch's jobs, which the lease table and the heartbeat keep
        # for each: a lost lease, a cancellation or a timeout of any job stops the batch.
        shared = _member_context(ready[0])
        contexts = [shared] * len(ready)
        is_async = self._loop is not None and asyncio.iscoroutinefunction(task.handler)
        until = None if task.timeout is None else time.monotonic() + task.timeout.total_seconds()
        ctx = BatchContext(
            task=task.name,
            queue=ready[0].queue,
            job_ids=[job.id for job in ready],
            members=[shared],
            session=functools.partial(handler_session, self._engine, until),
            async_session=self._async_session if is_async else None,
        )
        # The heartbeat looks for a handler waiting on a silent connection in the session of
        # each context it holds: the jobs' is the batch's.
        shared._sessions = ctx._sessions
        runs = self._pipeline.start_many(ready, contexts, task)
        failure: Exception | None = None
        started = time.monotonic()
        try:
            # One span for the batch: its leader's (see the batch tasks how-to).
            with self._pipeline.running(runs[0]):
                if is_async:
                    assert self._loop is not None
                    value = self._loop.submit(
                        cast(Coroutine[Any, Any, None], self._call_async(task, ctx, jobs))
                    ).result()
                else:
                    middleware = self._queue.middleware
                    handler = run_chain(middleware, task.handler) if middleware else task.handler
                    value = cast(Any, handler)(ctx, jobs)
                    if ctx.session_used:
                        ctx.session.flush()
            self._keep_results(task, ctx, ready, value)
        except Exception as exc:
            failure = exc
        elapsed = time.monotonic() - started
        for job, run in zip(ready, runs, strict=True):
            self._pipeline.ran(job, run, elapsed)
        self._settle(task, ctx, ready, contexts, failure, until)

    async def _call_async(self, task: Task, ctx: BatchContext, jobs: list[BatchJob[Any]]) -> object:
        """An ``async def`` batch handler's call, on the event loop; cancelled at its next
        ``await`` once a member must stop (lost lease, cancellation, timeout)."""
        middleware = self._queue.middleware
        handler: Any = (
            arun_chain(middleware, cast(Any, task.handler)) if middleware else task.handler
        )
        running = asyncio.ensure_future(cast(Awaitable[object], handler(ctx, jobs)))
        while not running.done():
            if any(member._stop for member in ctx._members):
                running.cancel()
                break
            await asyncio.wait({running}, timeout=ASYNC_STOP_CHECK)
        try:
            value = await running
        except asyncio.CancelledError:
            raise AttemptStoppedError("the worker cancelled this batch") from None
        if ctx.async_session_used:
            await ctx.async_session.flush()
        return value

    def _async_session(self) -> AsyncSession:
        from sqlalchemy.ext.asyncio import AsyncSession

        assert self._loop is not None
        return AsyncSession(bind=self._loop.engine(), sync_session_class=HandlerSession)

    def _keep_results(
        self, task: Task, ctx: BatchContext, ready: list[Claimed], value: object
    ) -> None:
        """Hold what a task that keeps results returned: one result per job, in order."""
        if not task.keep_result:
            return
        if not isinstance(value, list | tuple) or len(value) != len(ready):
            raise JobQueueError(
                f"batch task {task.name!r} keeps results: its handler returns a list of one"
                f" result per job ({len(ready)}), not {type(value).__name__}"
            )
        for job, result in zip(ready, value, strict=True):
            if job.id in ctx._marks:
                continue
            try:
                self._pipeline.keep(job, task, result)
            except UnstorableResultError as exc:
                ctx._marks[job.id] = exc  # this job alone goes to dead, as a single job would

    # -- settling ------------------------------------------------------------------------------

    def _settle(
        self,
        task: Task,
        ctx: BatchContext,
        ready: list[Claimed],
        contexts: list[JobContext],
        failure: Exception | None,
        until: float | None,
    ) -> None:
        if failure is None and ctx.session_used and ctx.async_session_used:
            failure = RuntimeError(BOTH_SESSIONS)
        if failure is not None:
            self._discard_sessions(ctx)
            for job, member in zip(ready, contexts, strict=True):
                verdict = settle(failure, wrote=False, shutting_down=shutting_down(member))
                self._recorder.record(job, verdict, task)
            return
        marks = ctx._marks
        done_jobs = [job for job in ready if job.id not in marks]
        marked = [job for job in ready if job.id in marks]
        done: set[int] = set()
        if not done_jobs:
            # Nothing to fence the batch's writes with: none of them commits.
            self._discard_sessions(ctx)
        elif ctx.async_session_used:
            assert self._loop is not None
            future = self._loop.submit(
                cast(Coroutine[Any, Any, None], self._complete_async(ctx.async_session, done_jobs))
            )
            done = cast(set[int], future.result())
        else:
            done = self._complete(ctx, done_jobs, until)
        if len(done) < len(done_jobs):
            # Some member could no longer complete: the batch committed nothing, and its
            # marked jobs go back with the others rather than to their own outcomes.
            for job in marked:
                self._recorder.results.take(job.id, job.attempts)
            why = "a job of their batch could not complete"
            self._recorder.completed_together(done_jobs, done, why, others=marked)
            return
        self._recorder.completed_together(done_jobs, done, "")
        for job in marked:
            self._recorder.record(job, settle(marks[job.id], wrote=False), task)

    def _complete(self, ctx: BatchContext, jobs: list[Claimed], until: float | None) -> set[int]:
        """Complete ``jobs`` (fenced) in the batch's transaction, and commit it if all matched
        (else roll it back); the ids the completion matched."""
        session = cast(
            HandlerSession,
            ctx.session if ctx.session_used else handler_session(self._engine, until),
        )
        try:
            conn = session.connection()
            with deadline(conn):
                done = self._recorder.complete_group(conn, jobs)
                if len(done) == len(jobs):
                    session.commit_for_real()
                    return done
            session.rollback()
            return done
        finally:
            session.close()

    async def _complete_async(self, session: AsyncSession, jobs: list[Claimed]) -> set[int]:
        """:meth:`_complete` in an async handler's session, on the event loop."""
        try:
            return await self._recorder.complete_group_async(session, jobs)
        finally:
            await session.close()

    def _discard_sessions(self, ctx: BatchContext) -> None:
        """Roll back and close whatever sessions the handler opened."""
        if ctx.session_used:
            ctx.session.rollback()
            ctx.session.close()
        if ctx.async_session_used:
            assert self._loop is not None
            session = ctx.async_session

            async def discard() -> None:
                await session.rollback()
                await session.close()

            self._loop.submit(discard()).result()


def _take_over(found: list[Claimed], claimed: list[Claimed], runnable: list[Claimed]) -> None:
    """Add the ``runnable`` jobs of a fill's claim to the batch (``found``).

    A member whose lease ran out while the batch formed (its worker was stopped, its
    connection lost) can come back in the claim at its next attempt, or finished (dead,
    cancelled). Its attempt in the batch is stale: no statement of it would pass the fence,
    and it never started, so it leaves the batch with nothing to record (its lease table
    entry is the new attempt's now), and the new attempt, if runnable, takes its place. So a
    batch never holds one job twice, and its handler never sees a stale attempt.
    """
    again = {job.id for job in claimed}
    if any(job.id in again for job in found):
        found[:] = [job for job in found if job.id not in again]
    found += runnable


def _decoded(jobs: list[Claimed]) -> list[Any]:
    """Each job's payload decoded, or the PayloadError its JSON text raised: all in one call
    to the JSON decoder when they all decode (the texts are JSON values the database wrote),
    else one by one."""
    try:
        return list(json.loads("[" + ",".join(job.payload for job in jobs) + "]"))
    except (ValueError, RecursionError):
        pass
    found: list[Any] = []
    for job in jobs:
        try:
            found.append(decode(job.payload))
        except PayloadError as exc:
            found.append(exc)
    return found


def _member_context(job: Claimed) -> JobContext:
    """The context the lease table and the heartbeat keep for the jobs of a batch: their stop
    flags (lost lease, cancellation, timeout, shutdown). It has no session of its own: it is
    given the :class:`BatchContext`'s once that is made."""
    return job.context(_no_session)


def _no_session() -> HandlerSession:
    raise JobQueueError("a batch's jobs share the session of their BatchContext")
