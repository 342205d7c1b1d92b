"""The methods of :class:`~sa_jobqueue.JobQueue` for jobs already enqueued: cancel, requeue,
read and count them, and read or wait for their results.

Private: users call these on a ``JobQueue``, which takes them from :class:`JobAdmin`. They are
thin delegates to :mod:`sa_jobqueue.ops.admin` and :mod:`sa_jobqueue.results` and need nothing
of the queue: no tasks, no options. The class holds no state and nothing overrides it; it is a
base of ``JobQueue`` only so that ``queue.py`` holds the registry and the enqueue shells and
stays readable in one sitting (see CONTRIBUTING.md, Layout).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, overload

from . import results
from ._binds import SessionLike, run_async
from .ops import admin
from .ops.admin import JobInfo
from .ops.depth import queue_depth
from .ops.filters import RequeueAttempts
from .results import JobResult

if TYPE_CHECKING:
    from sqlalchemy import Engine
    from sqlalchemy.ext.asyncio import AsyncEngine

    from ._binds import AsyncSessionLike


class JobAdmin:
    """Cancel, requeue, read and count jobs, and read or wait for their results; each in the
    caller's transaction (or, for the waits, on a connection of the engine's)."""

    # -- job admin: see sa_jobqueue.ops.admin ----------------------------------------------------

    def cancel(self, session: SessionLike, job_id: int) -> bool:
        """Cancel a job in the caller's transaction; True if it was queued or running.

        A queued job becomes ``cancelled`` and never runs. For a running job, cancellation is
        requested: its handler sees ``ctx.cancel_requested`` (and ``ctx.stop_requested``)
        within one lease-renewal interval, and when the attempt ends, whether it returns or
        raises, its ``ctx.session`` writes roll back and the job ends ``cancelled``, never
        retried. Python cannot interrupt a running thread, so a sync handler that does not
        look at the flag runs to its end first. A finished job is left as it is (False).
        """
        return admin.cancel_job(session, job_id)

    async def acancel(self, session: AsyncSessionLike, job_id: int) -> bool:
        """:meth:`cancel` for an ``AsyncSession`` or ``AsyncConnection``."""
        return await run_async(session, lambda conn: admin.cancel_job(conn, job_id))

    def requeue(
        self,
        session: SessionLike,
        job_id: int,
        *,
        attempts: RequeueAttempts = "extend",
    ) -> bool:
        """Put a ``dead`` job back in its queue, due now, in the caller's transaction.

        True if the job was dead and is queued again; False (nothing changed) if it is not
        dead, does not exist, or its unique key is now held by another waiting, queued or
        running job of its task. ``finished_at`` is cleared; ``last_error`` is kept until the
        next attempt records its own outcome. Never commits; one NOTIFY wakes the queue's
        workers at commit.

        ``attempts="extend"`` (the default) keeps the attempts already made and raises
        ``max_attempts`` by its current value: a job that used up 5 of 5 may run 5 more times
        (10 of 10). A job requeued again starts from its raised limit, so each requeue grants
        as many attempts as the job's limit was. Attempt numbers keep rising, and they are the
        fencing tokens: an attempt from before the requeue that is somehow still running (its
        worker froze past the lease) can never complete the job's new attempts.

        ``attempts="reset"`` sets ``attempts`` back to 0 and keeps ``max_attempts``. The
        attempt numbers are reused, which gives up that fencing: use it only when no earlier
        attempt of the job can still be running.
        """
        return admin.requeue_job(session, job_id, attempts=attempts)

    # -- inspection -------------------------------------------------------------------------

    def get_job(self, session: SessionLike, job_id: int) -> JobInfo | None:
        """Read one job as it is in the caller's transaction, or None if there is no such id."""
        return admin.get_job(session, job_id)

    async def aget_job(self, session: AsyncSessionLike, job_id: int) -> JobInfo | None:
        """:meth:`get_job` for an ``AsyncSession`` or ``AsyncConnection``."""
        return await run_async(session, lambda conn: admin.get_job(conn, job_id))

    def list_jobs(
        self,
        session: SessionLike,
        *,
        queue: str | None = None,
        status: str | Iterable[str] | None = None,
        task: str | None = None,
        older_than: timedelta | None = None,
        limit: int = 100,
        after_id: int | None = None,
        newest_first: bool = False,
        tags: str | Iterable[str] | None = None,
    ) -> list[JobInfo]:
        """Read up to ``limit`` jobs in id order (oldest first), in the caller's transaction.

        Filters: ``queue``, ``task``, ``status`` (one status or several), and ``older_than``
        (created longer ago than that, by the database's clock), and ``tags`` (one tag or
        several: the jobs carrying all of them; no index serves it, see the tags how-to).
        For the next page, pass the
        last id you got as ``after_id`` (keyset pagination: stable while rows come and go,
        and as cheap for the thousandth page as for the first). Bad filters raise
        InvalidJobError before any SQL is sent. ``limit`` is at most 10,000.

        ``newest_first`` reads the highest ids first, and ``after_id`` then means the jobs
        with lower ids: the next page goes on in the same direction. Ids are handed out in
        insert order, so this is the order jobs were enqueued in, not ``created_at``'s order
        (a transaction's jobs take their creation time from its start).
        """
        return admin.list_jobs(
            session,
            queue=queue,
            status=status,
            task=task,
            older_than=older_than,
            limit=limit,
            after_id=after_id,
            newest_first=newest_first,
            tags=tags,
        )

    # -- results ----------------------------------------------------------------------------

    def get_result(self, session: SessionLike, job_id: int) -> JobResult | None:
        """Job ``job_id``'s outcome as the caller's transaction sees it (None: no such job):
        its status, and, once it succeeded, what its handler returned if its task keeps
        results (``keep_result=True``). ``.get()`` gives the value or raises JobFailedError."""
        return results.get_result(session, job_id)

    async def aget_result(self, session: AsyncSessionLike, job_id: int) -> JobResult | None:
        """:meth:`get_result` for an ``AsyncSession`` or ``AsyncConnection``."""
        return await run_async(session, lambda conn: results.get_result(conn, job_id))

    @overload
    def wait_for_result(self, engine: Engine, job_id: int, *, timeout: float) -> JobResult: ...

    @overload
    def wait_for_result(
        self, engine: Engine, job_id: Sequence[int], *, timeout: float
    ) -> list[JobResult]: ...

    def wait_for_result(
        self, engine: Engine, job_id: int | Sequence[int], *, timeout: float
    ) -> JobResult | list[JobResult]:
        """Block until job ``job_id`` has ended (succeeded, dead or cancelled), or every job of
        a list of ids; the outcome, or the outcomes in the list's order.

        Woken by the NOTIFY of a stored result as it commits, and reading the jobs again
        every half second whatever it hears. Raises ResultTimeoutError after ``timeout``
        seconds, and UnknownJobError at once for an id with no job (not committed yet, or
        pruned). Takes one connection of ``engine`` while it waits. See
        :mod:`sa_jobqueue.results`.
        """
        if isinstance(job_id, int):
            return results.wait_for_results(engine, [job_id], timeout)[0]
        return results.wait_for_results(engine, job_id, timeout)

    @overload
    async def await_result(
        self, engine: AsyncEngine, job_id: int, *, timeout: float
    ) -> JobResult: ...

    @overload
    async def await_result(
        self, engine: AsyncEngine, job_id: Sequence[int], *, timeout: float
    ) -> list[JobResult]: ...

    async def await_result(
        self, engine: AsyncEngine, job_id: int | Sequence[int], *, timeout: float
    ) -> JobResult | list[JobResult]:
        """:meth:`wait_for_result` on an asyncio event loop, with an ``AsyncEngine``."""
        if isinstance(job_id, int):
            return (await results.await_results(engine, [job_id], timeout))[0]
        return await results.await_results(engine, job_id, timeout)

    def counts(self, session: SessionLike) -> dict[str, dict[str, int]]:
        """Job counts as ``{queue: {status: n}}``.

        It reads the whole table, finished history included; :meth:`depth` is the cheap read
        of the backlog for pollers."""
        return admin.count_jobs(session)

    def depth(
        self, bind: SessionLike | Engine, queues: Iterable[str] | None = None
    ) -> dict[str, int]:
        """Jobs a claim could take now, per queue, in one index-only statement.

        See :func:`sa_jobqueue.ops.queue_depth`: with ``queues`` each is present (0 if
        empty); a pause, a cap or a rate does not lower the count; jobs scheduled for later,
        waiting for dependencies or running are not counted."""
        return queue_depth(bind, queues)
