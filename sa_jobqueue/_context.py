"""The context a handler receives besides its payload: :class:`JobContext`.

Public as ``sa_jobqueue.JobContext`` (and ``sa_jobqueue.tasks.JobContext``). Its sessions,
made on first use, are a :class:`LazySessions`, as a batch's
(:class:`~sa_jobqueue.batching.BatchContext`) are.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy.orm import Session

from ._progress import ProgressReport, check_progress
from ._sql import admin as admin_sql
from ._sql import dependencies as dependencies_sql

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession


class LazySessions:
    """A handler's Session and AsyncSession, each made on first use: what ``session`` and
    ``async_session`` of :class:`JobContext` and of
    :class:`~sa_jobqueue.batching.BatchContext` read.

    The worker gives factories, so a handler that never looks at its session costs none; a
    context made by hand (in a test) may be given a Session already made. Made on the
    handler's thread; other threads (the heartbeat's) only read :attr:`made`.
    """

    __slots__ = ("_async_factory", "_async_session", "_factory", "_session")

    def __init__(
        self,
        session: Session | Callable[[], Session],
        async_session: AsyncSession | Callable[[], AsyncSession] | None,
    ) -> None:
        self._session: Session | None = None
        self._factory: Callable[[], Session] | None = None
        if isinstance(session, Session):
            self._session = session
        else:
            self._factory = session
        self._async_session: AsyncSession | None = None
        self._async_factory: Callable[[], AsyncSession] | None = None
        if callable(async_session):
            self._async_factory = async_session
        else:
            self._async_session = async_session

    @property
    def session(self) -> Session:
        """The Session, made now if it was not yet."""
        if self._session is None:
            assert self._factory is not None
            self._session = self._factory()
        return self._session

    @property
    def async_session(self) -> AsyncSession:
        """The AsyncSession, made now if it was not yet; RuntimeError when there is none to
        make (a sync handler, or a context made by hand without one)."""
        if self._async_session is None:
            if self._async_factory is None:
                raise RuntimeError("only an async def handler run by a worker has async_session")
            self._async_session = self._async_factory()
        return self._async_session

    @property
    def made(self) -> Session | None:
        """The Session if it was made (or given); None before."""
        return self._session

    @property
    def made_async(self) -> AsyncSession | None:
        """The AsyncSession if it was made (or given); None before."""
        return self._async_session


class JobContext:
    """What a handler receives besides its payload.

    ``session`` is a Session whose transaction the worker commits together with the job's
    completion: write through it and your writes happen exactly once, or not at all (a retry
    starts from a clean slate, and an attempt that lost its lease has its writes rolled back).
    Do not commit it yourself. Work done outside it (HTTP calls, e-mails, other connections)
    may happen more than once: execution is at-least-once.

    From the job's row, as the claim returned it (no query of their own): ``job_id``, ``task``,
    ``queue``, ``attempt`` (this attempt's number, from 1), ``max_attempts``, ``created_at``
    (when the job was enqueued: a timezone-aware datetime by the database's clock; compare it
    with the database's ``now()``, not the worker's clock, to know the job's age) and
    ``priority`` (lower runs first; give it to the jobs the handler enqueues to keep a flow's
    priority). They are not read again during the attempt: a change to the row meanwhile
    shows only as ``cancel_requested``. A context made by hand (in a test) has ``created_at``
    now unless given, and ``priority`` 0.

    :meth:`report_progress` keeps a progress for the job's row, written by the worker's
    heartbeat without a statement of its own.
    """

    __slots__ = (
        "_cancel",
        "_forward_progress",
        "_progress",
        "_progress_written",
        "_sessions",
        "_shutdown",
        "_stop",
        "attempt",
        "created_at",
        "job_id",
        "max_attempts",
        "priority",
        "queue",
        "task",
    )

    def __init__(
        self,
        *,
        job_id: int,
        task: str,
        queue: str,
        attempt: int,
        max_attempts: int,
        session: Session | Callable[[], Session],
        async_session: AsyncSession | Callable[[], AsyncSession] | None = None,
        created_at: datetime | None = None,
        priority: int = 0,
    ) -> None:
        self.job_id = job_id
        self.task = task
        self.queue = queue
        self.attempt = attempt
        self.max_attempts = max_attempts
        self.created_at = datetime.now(UTC) if created_at is None else created_at
        self.priority = priority
        self._sessions = LazySessions(session, async_session)
        # Plain flags, set by the worker's heartbeat thread and read by the handler's.
        self._stop = False
        self._cancel = False
        self._shutdown = False  # set by the worker as it shuts down
        # The latest report (set by the handler's thread), and the one the heartbeat last
        # wrote or gave up on (set by the heartbeat's thread): see sa_jobqueue/_progress.py.
        self._progress: ProgressReport | None = None
        self._progress_written: ProgressReport | None = None
        # Where a child process running the attempt (hard_timeout) sends each report.
        self._forward_progress: Callable[[ProgressReport], None] | None = None

    def __repr__(self) -> str:
        return (
            f"JobContext(job_id={self.job_id}, task={self.task!r}, queue={self.queue!r},"
            f" attempt={self.attempt}/{self.max_attempts})"
        )

    @property
    def session(self) -> Session:
        """The Session to write through (created on first use)."""
        return self._sessions.session

    @property
    def async_session(self) -> AsyncSession:
        """The AsyncSession an ``async def`` handler writes through (created on first use).

        Its transaction commits with the job's fenced completion, as ``session``'s does for a
        sync handler; do not commit it yourself. Only an async handler run by a worker has
        one.
        """
        return self._sessions.async_session

    @property
    def async_session_used(self) -> bool:
        """Whether the handler asked for its async session at all."""
        return self._sessions.made_async is not None

    @property
    def session_used(self) -> bool:
        """Whether the handler asked for its session at all."""
        return self._sessions.made is not None

    def upstream_results(self) -> dict[int, Any]:
        """What the jobs this one waited for returned (``depends_on``, a chain's step before, a
        chord's group), by job id in id order: each one's stored result (None for a task that
        keeps none). Read through :attr:`session`, in the job's transaction."""
        rows = self.session.execute(dependencies_sql.upstream_results(), {"job_id": self.job_id})
        return {job_id: result for job_id, result in rows}

    async def aupstream_results(self) -> dict[int, Any]:
        """:meth:`upstream_results` for an ``async def`` handler, through
        :attr:`async_session`."""
        query = dependencies_sql.upstream_results()
        rows = await self.async_session.execute(query, {"job_id": self.job_id})
        return {job_id: result for job_id, result in rows}

    def tags_and_meta(self) -> tuple[list[str], dict[str, Any]]:
        """The job's tags and meta (``[]`` and ``{}`` when it has none), read through
        :attr:`session`: one lookup by primary key, in the job's transaction.

        Not part of the claim: every job would carry them to its worker whether its handler
        looks at them or not, so only a handler that asks pays for them. They are read as
        they are now; nothing changes them after enqueue but a hand-written UPDATE.
        """
        row = self.session.execute(_TAGS_AND_META, {"job_id": self.job_id}).one_or_none()
        return _labels(row)

    async def atags_and_meta(self) -> tuple[list[str], dict[str, Any]]:
        """:meth:`tags_and_meta` for an ``async def`` handler, through :attr:`async_session`."""
        result = await self.async_session.execute(_TAGS_AND_META, {"job_id": self.job_id})
        return _labels(result.one_or_none())

    def report_progress(self, fraction: float, message: str | None = None) -> None:
        """Say how far the job has got: ``fraction`` from 0 to 1, and an optional message.

        Shown by ``sa-jobqueue jobs show``, the dashboard's job page and its API, and
        ``JobQueue.get_job``. The call only keeps the report in memory (no statement, no lock)
        and returns at once; the worker writes the latest report with its next lease renewal,
        which a report brings forward to at most ``PROGRESS_INTERVAL`` (2 s) after the last
        one, however often the handler reports. A report replaces the last one whole: a
        report without a message clears the message.

        A fraction that is not a finite number from 0 to 1, or a message longer than 200
        characters or that the database could not store, raises
        :class:`~sa_jobqueue.errors.InvalidProgressError` here (a bug in the handler, which
        fails the attempt like any other exception unless the handler catches it).

        What it does not promise: that every report is written (only the latest one at each
        renewal is), nor that the last one is: the completion writes none, so a job that
        finishes between two renewals keeps the progress the last renewal wrote, or none. A
        failed write never reaches the handler: the report is dropped and the leases renewed
        without it. Progress is not fenced at the call, only at the write: an attempt that
        lost its lease writes nothing. The next attempt of the job starts with no progress.
        """
        self._keep_progress(check_progress(fraction, message))

    def _keep_progress(self, report: ProgressReport) -> None:
        """Keep a checked report for the heartbeat to write (the one way a report is kept, a
        batch's included); a child process running the attempt also sends it to its worker."""
        self._progress = report  # one reference, replaced whole: see _progress.py
        forward = self._forward_progress
        if forward is not None:
            forward(report)

    @property
    def progress(self) -> tuple[float, str | None] | None:
        """The latest report of this attempt as ``(fraction, message)``; None before any."""
        return self._progress

    @property
    def stop_requested(self) -> bool:
        """True once this attempt should stop early.

        Its lease was lost (it expired, or the job was claimed again), it ran past its
        timeout, or the job was cancelled: nothing it does afterwards can complete the job,
        but for one case: a lease that merely expired, with no worker having claimed the job
        again yet (the fence names the attempt, not the lease), completes it. Or its worker is
        shutting down (SIGTERM, ``stop()``): then returning completes the job as usual, and
        raising hands it back to the queue with this attempt uncounted and its ``session``
        writes rolled back, to run again at once on another worker (``Retry`` and ``Discard``
        still do what they say).
        """
        return self._stop or self._shutdown

    @property
    def cancel_requested(self) -> bool:
        """True once ``JobQueue.cancel`` was called for this job (seen at a lease renewal)."""
        return self._cancel


_TAGS_AND_META: Final = admin_sql.job_by_id(("tags", "meta"))


def _labels(row: Any) -> tuple[list[str], dict[str, Any]]:
    if row is None:
        return [], {}
    tags, meta = row
    return list(tags or ()), dict(meta) if isinstance(meta, dict) else {}
