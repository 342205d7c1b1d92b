"""Batch tasks: a handler that takes its jobs in batches, in one transaction.

A task declared with ``@queue.batch_task(...)`` is enqueued as any task, one job per payload;
a worker runs its jobs in batches: the handler is called as ``handler(ctx, jobs)`` with a
:class:`BatchContext` and a list of :class:`BatchJob`, and what it writes through
``ctx.session`` commits in one transaction with the fenced completions of the batch's jobs.

A batch is formed by the job thread that takes one of the task's jobs (the leader): it claims
up to ``max_size - 1`` more due jobs of the task (of the same queue, and with ``batch_key``,
the same value of that payload field), with the claim rules of the queue (pause, caps, rates,
dependencies, ``run_at``, priority order), and waits up to ``max_wait`` from the leader's
claim for more while the batch is not full. Each job's attempt is counted by its own claim.

What it does not promise: that a batch is full, or that two jobs enqueued together run in the
same batch; that a handler runs once (execution is at-least-once, as for any task); that a
batch's writes commit when any of its jobs can no longer complete (its lease lost, cancelled,
timed out): then the batch commits nothing and its other jobs run again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic

from sqlalchemy.orm import Session

from ._context import LazySessions
from ._progress import check_progress
from .errors import InvalidJobError, TaskDefinitionError
from .tasks import Discard, JobContext, P, Retry

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

__all__ = ["BatchContext", "BatchJob", "Batching"]

#: The largest ``max_size`` a batch task may ask for: a batch's claim and completion are one
#: statement each, with an array of this many ids, and the handler holds them all in memory.
MAX_BATCH_SIZE = 10_000


@dataclass(frozen=True)
class Batching:
    """How a batch task forms its batches (see ``JobQueue.batch_task``)."""

    max_size: int = 100
    max_wait: timedelta = timedelta(milliseconds=200)
    batch_key: str | None = None

    def check(self, task: str, lease: timedelta) -> None:
        """TaskDefinitionError, naming ``task``, if an option is out of its bounds."""
        where = f"task {task!r}"
        if isinstance(self.max_size, bool) or not isinstance(self.max_size, int):
            raise TaskDefinitionError(f"{where}: max_size must be an int")
        if not 1 <= self.max_size <= MAX_BATCH_SIZE:
            raise TaskDefinitionError(f"{where}: max_size must be from 1 to {MAX_BATCH_SIZE}")
        if not isinstance(self.max_wait, timedelta) or self.max_wait < timedelta(0):
            raise TaskDefinitionError(f"{where}: max_wait must be a timedelta of zero or more")
        # The first jobs of a batch hold their leases while it fills: a wait as long as a
        # third of the lease would leave the heartbeat no room for a failed renewal.
        if self.max_wait * 3 > lease:
            raise TaskDefinitionError(f"{where}: max_wait must be at most a third of the lease")
        key = self.batch_key
        if key is not None and (not isinstance(key, str) or not 1 <= len(key) <= 200):
            raise TaskDefinitionError(
                f"{where}: batch_key is the name of a top-level payload field, not {key!r}"
            )


@dataclass(frozen=True, slots=True)
class BatchJob(Generic[P]):
    """One job of a batch, as its handler gets it: read from the job's row by its claim.

    ``payload`` is the job's payload (a typed payload rebuilt, as for a single job);
    ``attempt`` its attempt's number, from 1. Not read again while the batch runs.
    """

    id: int
    payload: P
    attempt: int
    max_attempts: int
    created_at: datetime
    priority: int = 0


class BatchContext:
    """What a batch handler receives besides its jobs: one session, and per-job verdicts.

    ``session`` (``async_session`` for an ``async def`` handler) is one Session for the whole
    batch; the worker commits it with the fenced completions of the batch's jobs that
    succeed, so the batch's writes happen exactly once or not at all. Do not commit it.

    By default every job of the batch succeeds when the handler returns, and every job fails
    when it raises (each job's failure counted and retried under its own policy; a raised
    :class:`~sa_jobqueue.Retry` or :class:`~sa_jobqueue.Discard` applies to all). The handler
    can instead give single jobs another verdict with :meth:`fail`, :meth:`retry` and
    :meth:`discard`, while the rest succeed. Writes the handler made for a job it marks so
    commit with the batch all the same: leave such a job's rows out of what you write.

    What it does not promise: that the batch commits. If any of its jobs can no longer
    complete (its lease lost, its cancellation requested, its timeout passed), nothing the
    batch wrote commits, and its other jobs are handed back to run again.
    """

    __slots__ = (
        "_ids",
        "_marks",
        "_members",
        "_sessions",
        "queue",
        "task",
    )

    def __init__(
        self,
        *,
        task: str,
        queue: str,
        job_ids: Iterable[int],
        members: list[JobContext],
        session: Session | Callable[[], Session],
        async_session: Callable[[], AsyncSession] | None = None,
    ) -> None:
        self.task = task
        self.queue = queue
        # The contexts whose stop flags the worker sets (lost lease, cancellation, timeout,
        # shutdown): one shared by all the batch's jobs, or one each.
        self._members = members
        self._ids = frozenset(job_ids)
        #: The verdicts the handler gave single jobs: the exception each stands for.
        self._marks: dict[int, Exception] = {}
        self._sessions = LazySessions(session, async_session)

    def __repr__(self) -> str:
        return f"BatchContext(task={self.task!r}, queue={self.queue!r}, jobs={len(self._ids)})"

    @property
    def session(self) -> Session:
        """The Session the batch writes through (created on first use)."""
        return self._sessions.session

    @property
    def async_session(self) -> AsyncSession:
        """The AsyncSession an ``async def`` batch handler writes through (created on first
        use); committed with the batch's completions, as :attr:`session` is."""
        return self._sessions.async_session

    @property
    def session_used(self) -> bool:
        """Whether the handler asked for its session at all."""
        return self._sessions.made is not None

    @property
    def async_session_used(self) -> bool:
        """Whether the handler asked for its async session at all."""
        return self._sessions.made_async is not None

    @property
    def stop_requested(self) -> bool:
        """True once the batch should stop early: one of its jobs lost its lease, was
        cancelled or ran past its timeout (the batch can no longer commit), or the worker is
        shutting down (returning then still completes the batch)."""
        return any(member.stop_requested for member in self._members)

    def report_progress(self, fraction: float, message: str | None = None) -> None:
        """Say how far the batch has got: one progress for the whole batch, shown on every one
        of its jobs (each row carries the same fraction and message).

        As :meth:`JobContext.report_progress <sa_jobqueue.JobContext.report_progress>`: kept
        in memory and written with the next lease renewal of the batch's jobs, never a
        statement of its own; a fraction or message that is not valid raises
        :class:`~sa_jobqueue.errors.InvalidProgressError` here. There is no progress per job
        of a batch: the batch runs, commits and is retried as one.
        """
        report = check_progress(fraction, message)  # checked once, however many members
        for member in self._members:  # one context, shared by the batch's jobs
            member._keep_progress(report)

    @property
    def progress(self) -> tuple[float, str | None] | None:
        """The batch's latest report as ``(fraction, message)``; None before any."""
        return self._members[0].progress if self._members else None

    def fail(self, job: BatchJob[Any], error: BaseException | str) -> None:
        """Fail this job alone: its attempt is recorded as failed with ``error`` and retried
        under its own policy (dead once out of attempts); the rest of the batch goes on."""
        exc = error if isinstance(error, Exception) else RuntimeError(str(error))
        self._mark(job, exc)

    def retry(self, job: BatchJob[Any], after: timedelta = timedelta(0), reason: str = "") -> None:
        """Run this job again ``after`` from now, as a raised :class:`~sa_jobqueue.Retry` would
        for a single job; the rest of the batch goes on."""
        self._mark(job, Retry(after=after, reason=reason))

    def discard(self, job: BatchJob[Any], reason: str) -> None:
        """Give this job up (dead, with ``reason``), as a raised :class:`~sa_jobqueue.Discard`
        would for a single job; the rest of the batch goes on."""
        self._mark(job, Discard(reason))

    def _mark(self, job: BatchJob[Any], verdict: Exception) -> None:
        if not isinstance(job, BatchJob) or job.id not in self._ids:
            raise InvalidJobError(f"{job!r} is not a job of this batch")
        self._marks[job.id] = verdict
