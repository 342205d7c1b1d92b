"""One attempt, from its start to what its handler left: the pipeline every way of running a
job goes through.

    start (lease armed, observers told) → payload rebuilt (a typed task's) → middleware and
    handler → the session flushed → the result kept → ran (run time noted, observers told)

Then the caller settles: it asks :func:`~sa_jobqueue.worker._settlement.settle` for the verdict
from what :class:`Pipeline` returned and hands it to the
:class:`~sa_jobqueue.worker._recorder.Recorder`, the one door an outcome leaves by. What the
ways differ in stays with them: which session the handler writes through (its own transaction,
a savepoint of its thread's group, an async session, a batch's; ``_runner``, ``_batches``), on
which thread or process the handler runs (a job thread, the event loop, a child process of
``_isolation``), and so how its writes commit with the completion.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from .._backoff import policy_of
from ..observability import JobRun
from ..queue import JobQueue
from ..tasks import JobContext, Task
from ._claimed import Claimed
from ._leases import LeaseTable
from ._recorder import Recorder
from ._sessions import pending_writes

#: Weight of the newest run in a task's moving average of run times.
DURATION_WEIGHT = 0.2

#: What a handler is called with: the attempt's context and its payload.
Handler = Callable[[JobContext, Any], object]
AsyncHandler = Callable[[JobContext, Any], Awaitable[object]]


class Pipeline:
    """Runs attempts' handlers between their start and their run time, the same way for every
    path; keeps each task's usual run time (a moving average), which decides whether a sync
    job joins its thread's group.

    What it does not do: choose the session, the thread or the process, or write anything;
    a handler's exception is returned, never raised.
    """

    def __init__(self, queue: JobQueue, leases: LeaseTable, recorder: Recorder) -> None:
        self._queue = queue
        self._leases = leases
        self._recorder = recorder
        self._reports = recorder.reports
        self._observe = recorder.reports.observe
        self._durations: dict[str, float] = {}  # task -> moving average of its run time

    def usual(self, task: str) -> float | None:
        """The task's usual run time (seconds), once one of its attempts ran here."""
        return self._durations.get(task)

    def start(self, job: Claimed, task: Task, ctx: JobContext) -> JobRun | None:
        """Just before a handler starts: arm its timeout, give the heartbeat its context, tell
        the observers. The attempt's run, for the observers (None: there are none)."""
        run = job.run() if self._observe else None
        self._leases.start(job, ctx, task, run, policy_of(job.id, job.backoff, task.backoff))
        if run is not None:
            self._observe.started(run)
        return run

    def start_many(
        self, jobs: list[Claimed], contexts: list[JobContext], task: Task
    ) -> list[JobRun | None]:
        """:meth:`start` for a batch's jobs, each with its context; without observers, in one
        call to the lease table."""
        if self._observe:
            return [self.start(job, task, ctx) for job, ctx in zip(jobs, contexts, strict=True)]
        policies = [policy_of(job.id, job.backoff, task.backoff) for job in jobs]
        self._leases.start_many(jobs, contexts, task, policies)
        return [None] * len(jobs)

    @contextlib.contextmanager
    def running(self, run: JobRun | None) -> Iterator[None]:
        """The span the observers open around a handler's run (none without observers)."""
        if run is None:
            yield
            return
        with self._observe.running(run):
            yield

    def ran(self, job: Claimed, run: JobRun | None, elapsed: float | None) -> None:
        """Just after a handler returned or raised (``elapsed`` seconds after it started;
        None: it never ran): note its run time, tell the observers."""
        if run is not None:
            self._reports.ran(job, run, elapsed)
        if elapsed is None:
            return
        usual = self._durations.get(job.task)
        self._durations[job.task] = (
            elapsed if usual is None else usual + DURATION_WEIGHT * (elapsed - usual)
        )

    def run(
        self, job: Claimed, task: Task, ctx: JobContext, payload: Any, handler: Handler
    ) -> tuple[object, Exception | None]:
        """One attempt on this thread, whole: what the handler returned (its result kept for
        the completion), or the exception it (or the rebuilding of its payload, the flush of
        its session, the keeping of its result) raised."""
        run = self.start(job, task, ctx)
        value: object = None
        failure: Exception | None = None
        started = time.monotonic()
        try:
            with self.running(run):
                value = handler(ctx, self._rebuilt(task, payload))
                if ctx.session_used:
                    ctx.session.flush()
            self.keep(job, task, value)
        except Exception as exc:
            failure = exc
        self.ran(job, run, time.monotonic() - started)
        return value, failure

    async def arun(
        self,
        job: Claimed,
        task: Task,
        ctx: JobContext,
        payload: Any,
        handler: AsyncHandler,
    ) -> Exception | None:
        """:meth:`run` for an ``async def`` handler, on the event loop: the exception, if any."""
        run = self.start(job, task, ctx)
        failure: Exception | None = None
        started = time.monotonic()
        try:
            with self.running(run):
                value = await handler(ctx, self._rebuilt(task, payload))
                if ctx.async_session_used and pending_writes(ctx.async_session):
                    await ctx.async_session.flush()
            self.keep(job, task, value)
        except Exception as exc:
            failure = exc
        self.ran(job, run, time.monotonic() - started)
        return failure

    def keep(self, job: Claimed, task: Task, value: object) -> None:
        """Hold what a task that keeps results returned, for its completion to store; a value
        that cannot be stored raises ``UnstorableResultError``."""
        if task.keep_result:
            self._recorder.results.keep(job, task, value, self._queue.max_payload_bytes)

    @staticmethod
    def _rebuilt(task: Task, payload: Any) -> Any:
        # A typed payload: one that no longer fits its type fails this attempt, which is
        # retried under the task's policy like any failure.
        return payload if task.payload_codec is None else task.payload_codec.rebuild(payload)
