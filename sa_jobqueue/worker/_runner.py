"""Running claimed jobs: on a job thread (alone or in a group), on the event loop, or in a
child process (a hard-limited task's).

Each path runs its attempt through the :class:`~sa_jobqueue.worker._attempt.Pipeline`, asks
:func:`~sa_jobqueue.worker._settlement.settle` for the verdict, and hands it to the
:class:`~sa_jobqueue.worker._recorder.Recorder`; what differs is only the session the handler
wrote through (its own transaction, a savepoint of its thread's group, an async session) and
so how its writes commit with the completion.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import threading
import time
from collections.abc import Coroutine
from queue import Empty
from typing import TYPE_CHECKING, Any, cast

import psycopg
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from ..errors import PayloadError, UnknownTaskError
from ..middleware import ProceedArun, ProceedRun, arun_chain, run_chain
from ..queue import JobQueue
from ..tasks import JobContext, Task
from ._attempt import Pipeline
from ._batches import Batches
from ._claimed import Claimed
from ._event_loop import EventLoopThread, Slots
from ._groups import GROUP_FAST, GROUP_IDLE, Groups, ThreadState, drop_connection
from ._isolation import Isolation, child_session
from ._lanes import Intake, Lane
from ._leases import LeaseTable, Stage, Ticket
from ._recorder import Recorder
from ._sessions import HandlerSession, decode, handler_session
from ._settlement import ABANDON, Complete, settle, shutting_down

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

log = logging.getLogger("sa_jobqueue.worker")


class Runner:
    """Runs claimed attempts and settles them: job threads, and the event loop if any.

    What it does not promise: that a handler runs once, or runs to its end. A sync handler is
    asked to stop (``ctx.stop_requested``) and may not; an async one is cancelled at its next
    ``await``. Either way the fence keeps a stale attempt's outcome out of the database.
    """

    def __init__(
        self,
        queue: JobQueue,
        engine: Engine,
        leases: LeaseTable,
        recorder: Recorder,
        pipeline: Pipeline,
        groups: Groups,
        *,
        loop: EventLoopThread | None,
        stopping: threading.Event,
        wake: threading.Event,
        intake: Intake,
        batches: Batches | None = None,
    ) -> None:
        self._queue = queue
        self._engine = engine
        self._leases = leases
        self._recorder = recorder
        self._pipeline = pipeline
        self._groups = groups
        self._loop = loop
        self._stopping = stopping
        self._wake = wake
        # Hard-limited tasks' attempts run in child processes, forked from a forkserver that
        # is started with the worker.
        hard = any(t.hard_timeout is not None for t in queue.tasks.values())
        self._isolation = Isolation(queue, engine) if hard else None
        # A batch task's jobs go to a thread whatever its handler: the thread forms the batch.
        self._batches = batches
        self._async_tasks = {
            name
            for name, t in queue.tasks.items()
            if inspect.iscoroutinefunction(t.handler) and t.batching is None
        }
        self._async_slots: dict[Lane, Slots] = {}
        intake.attach(self.submit)  # the port the recorder's hand-off submits through

    def submit(self, lane: Lane, job: Claimed) -> None:
        """Take a claimed attempt: to the event loop, or into the lane's buffer for a thread."""
        ticket = self._leases.hold(lane, job)
        if job.task in self._async_tasks:
            # Straight to the event loop: an async handler needs no thread, so it starts even
            # while every thread is busy.
            if not self._taken(ticket):
                return
            attempt = self._execute(job, ThreadState(lane))
            if attempt is None:
                self._finished(ticket)
            else:
                assert self._loop is not None
                slots = self._async_slots.get(lane)
                if slots is None:  # up to the lane's concurrency of its async jobs at once
                    slots = self._async_slots.setdefault(lane, self._loop.slots(lane.concurrency))
                self._loop.start_soon(self._on_loop(attempt, ticket), slots)
            return
        lane.put(ticket)

    def _taken(self, ticket: Ticket) -> bool:
        """Whether the ticket's job may start now (see ``LeaseTable.take``).

        Not if shutdown handed it back first. Not if its lease ran out while it waited (or a
        renewal found it lost): it is handed back, fenced, as at shutdown, so that its attempt
        is not counted and it keeps its place in the claim order; a no-op if another claim has
        taken the job over meanwhile.
        """
        if self._leases.take(ticket):
            return True
        if ticket.stage is Stage.LOST:
            self._recorder.hand_back([ticket.job], "their leases ran out before they started")
            self._wake.set()
        return False

    async def _on_loop(self, attempt: Coroutine[Any, Any, None], ticket: Ticket) -> None:
        """An async handler's attempt, on the event loop; its slot is free once it is over."""
        try:
            await attempt
        finally:
            self._finished(ticket)

    def _finished(self, ticket: Ticket) -> None:
        if self._leases.let_go(ticket):
            self._wake.set()

    def thread(self, lane: Lane) -> None:
        """A job thread: run a lane's claimed jobs one after another until told to finish."""
        here = ThreadState(lane)
        while True:
            try:
                # With a group open, do not sit on its row locks waiting for work.
                ticket = lane.next_ticket(timeout=GROUP_IDLE if here.group else None)
            except Empty:
                self._groups.commit(here)
                continue
            if ticket is None:
                self._groups.commit(here)
                drop_connection(here)
                return
            if not self._taken(ticket):
                continue
            try:
                self._execute(ticket.job, here)
                # Commit before the job counts as finished: a burst ends once nothing runs,
                # and what the group's jobs wrote (jobs they enqueued) must be in by then.
                if here.group is not None and (here.group.due or lane.buffer_empty):
                    self._groups.commit(here)
            finally:
                self._finished(ticket)

    def _execute(self, job: Claimed, here: ThreadState) -> Coroutine[Any, Any, None] | None:
        try:
            if self._batches is not None and job.task in self._batches.tasks:
                # A batch runs in a transaction of its own, as a slow task does.
                self._groups.commit(here)
                drop_connection(here)
                self._batches.run(job, here.lane)
                return None
            return self._execute_fenced(job, here)
        except (SQLAlchemyError, psycopg.Error) as exc:  # psycopg's own: a group's savepoints
            # Most likely the connection was lost: the thread must go on serving jobs with a
            # fresh one, whatever state this one was left in.
            self._recorder.unrecorded([job], exc)
            if here.group is not None:
                self._groups.commit(here)  # keep what the group completed before, if it can
            drop_connection(here)
        except Exception:  # pragma: no cover - a bug of ours; keep the worker alive
            log.exception("job %d: internal error while running it", job.id)
        return None

    def _execute_fenced(self, job: Claimed, here: ThreadState) -> Coroutine[Any, Any, None] | None:
        """Run one attempt; for an async handler, return it, to run on the event loop."""
        try:
            task = self._queue.get_task(job.task)
        except UnknownTaskError as exc:
            # Most likely a rolling deploy (newer code enqueued it): a failure with backoff,
            # so that a worker that knows the task can run it later.
            self._recorder.unknown_task(job, exc)
            return None
        try:
            payload = decode(job.payload)
        except PayloadError as exc:
            # No later attempt could do better: straight to dead, with the reason.
            self._recorder.unrunnable(job, exc)
            return None
        if task.hard_timeout is not None:  # in a child process of its own (see _isolation)
            self._groups.commit(here)
            drop_connection(here)
            self._run_isolated(job, task, payload)
            return None
        is_async = inspect.iscoroutinefunction(task.handler)
        # A slow task runs in a transaction of its own: commit the group before it starts, or
        # the group's row locks would be held for as long as it runs.
        usual = self._pipeline.usual(job.task)
        grouped = not is_async and usual is not None and usual < GROUP_FAST
        if not grouped:
            # ... and give its connection back: a job never holds two connections at once.
            self._groups.commit(here)
            drop_connection(here)
        # The session is made when the handler first asks for it, and connects when first
        # used: a handler that never touches the database costs no session, no connection and
        # no commit of its own.
        # A task with a timeout: its handler's connection is cut soon after the timeout, so a
        # statement that never answers cannot hold the thread for ever (see _sessions._arm).
        until = None if task.timeout is None else time.monotonic() + task.timeout.total_seconds()
        ctx = job.context(
            functools.partial(self._groups.session, here, until)
            if grouped
            else functools.partial(handler_session, self._engine, until),
            self._async_session if is_async else None,
        )
        if is_async:
            return self._run_async(job, task, payload, ctx)
        _, failure = self._pipeline.run(job, task, ctx, payload, self._handler(task))
        if grouped and ctx.session_used:
            self._groups.settle(here, job, task, ctx, failure)
        else:
            self._settle_alone(job, task, ctx, failure)
        return None

    def _run_isolated(self, job: Claimed, task: Task, payload: Any) -> None:
        """A hard-limited task's attempt, run in a child (see :mod:`._isolation`): the
        pipeline's start and run time here, its payload, handler and result in the child."""
        assert self._isolation is not None
        ctx = job.context(child_session)
        run = self._pipeline.start(job, task, ctx)
        started = time.monotonic()
        with self._pipeline.running(run):
            end = self._isolation.attempt(job, task, payload, ctx)
        self._pipeline.ran(job, run, time.monotonic() - started)
        self._recorder.child_ended(job, task, end)

    def _handler(self, task: Task) -> ProceedRun:
        """The task's handler, inside the queue's middleware (none: the handler itself)."""
        middleware = self._queue.middleware
        return run_chain(middleware, task.handler) if middleware else task.handler

    def _ahandler(self, task: Task) -> ProceedArun:
        """:meth:`_handler` for an ``async def`` handler."""
        handler = cast(ProceedArun, task.handler)
        return arun_chain(self._queue.middleware, handler) if self._queue.middleware else handler

    # -- settling: the session's side; the verdict is settle()'s, the writing the recorder's --

    def _settle_alone(
        self,
        job: Claimed,
        task: Task,
        ctx: JobContext,
        failure: Exception | None,
        both_sessions: bool = False,
    ) -> None:
        """Settle a job that ran in a transaction of its own (or none)."""
        session = cast(HandlerSession, ctx.session) if ctx.session_used else None
        verdict = settle(
            failure,
            wrote=session is not None and session.in_transaction(),
            both_sessions=both_sessions,
            shutting_down=shutting_down(ctx),
        )
        try:
            if isinstance(verdict, Complete):
                if verdict.batched:
                    self._recorder.record(job, verdict, task)
                    return
                # The fenced completion in the handler's own transaction: its writes and the
                # job's success commit together, or (stale attempt, cancel) roll back together.
                assert session is not None
                if self._recorder.complete_in(session, job):
                    return
                verdict = ABANDON
            if session is not None:
                session.rollback()
        finally:
            if session is not None:
                session.close()
        # The handler's connection is back in the pool before the outcome is recorded, so a
        # job never holds two connections at once.
        self._recorder.record(job, verdict, task)

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
    ) -> None:
        """An async handler's attempt, on the event loop, in one of its lane's slots (up to
        the lane's concurrency at once).

        Sync work it cannot avoid (recording a failure) goes to the loop's thread pool, so
        one job's database round trip never stalls the other handlers on the loop; a success
        with nothing to commit joins the next batch of completions from the loop itself.
        """
        assert self._loop is not None
        try:
            if self._stopping.is_set():
                # Shutting down before it could start: back to the queue uncounted, as
                # a buffered sync job is.
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(None, self._recorder.hand_back, [job], "not started")
                return
            handler = self._ahandler(task)
            supervised = self._loop.supervised

            async def supervise(ctx: JobContext, payload: Any) -> object:
                return await supervised(handler(ctx, payload), ctx)

            failure = await self._pipeline.arun(job, task, ctx, payload, supervise)
            await self._settle_async(job, task, ctx, failure)
        except (SQLAlchemyError, psycopg.Error) as exc:
            # A statement of its own, off the loop (like recording any other outcome).
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, self._recorder.unrecorded, [job], exc)
        except Exception:  # pragma: no cover - a bug of ours; keep the loop alive
            log.exception("job %d: internal error while running it", job.id)

    async def _settle_async(
        self, job: Claimed, task: Task, ctx: JobContext, failure: Exception | None
    ) -> None:
        loop = asyncio.get_running_loop()
        session = ctx.async_session if ctx.async_session_used else None
        if ctx.session_used:
            # A sync session (beside an async one or not): settle as a sync handler's job, on a
            # thread of the loop's pool (a sync session blocks).
            if session is not None:
                await session.rollback()
                await session.close()
            both = session is not None
            await loop.run_in_executor(None, self._settle_alone, job, task, ctx, failure, both)
            return
        wrote = session is not None and session.in_transaction()
        verdict = settle(failure, wrote=wrote, shutting_down=shutting_down(ctx))
        if session is not None:
            try:
                if isinstance(verdict, Complete) and not verdict.batched:
                    # The fenced completion in the handler's own transaction, as for a sync
                    # one.
                    if await self._recorder.complete_in_async(session, job):
                        return
                    verdict = ABANDON
            finally:
                # Closing rolls back what was not committed: a failed handler's writes, a
                # stale attempt's, or a transaction that only read.
                await session.close()
        # The session's connection is back in its pool before the outcome is recorded, as
        # for a sync handler. A success joins the next batch from here: no statement to wait
        # for (unless the batches are held back: see try_batch).
        if isinstance(verdict, Complete) and self._recorder.try_batch(job):
            return
        await loop.run_in_executor(None, self._recorder.record, job, verdict, task)
