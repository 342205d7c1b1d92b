"""Job admin: read, list, count, cancel and requeue jobs, in the caller's transaction.

What ``JobQueue.get_job``, ``list_jobs``, ``counts``, ``cancel`` and ``requeue`` do, without a
JobQueue: none of it needs the registered tasks, so operators' tools (the ``sa-jobqueue jobs``
commands) call these functions directly. Each takes a Session, scoped_session or Connection,
runs in its transaction and never commits; bad arguments raise InvalidJobError before any SQL
is sent, and before the session is asked for its connection.

What is not promised: a consistent picture across calls. Each call is one or two statements
and sees the jobs as its transaction does; workers change them meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from .._binds import SessionLike, connection_of
from .._enqueue import wake
from .._sql import admin as admin_sql
from .._sql import dependencies as dependencies_sql
from .._sql.finished import requeue_dead
from .._sql.listing import select_jobs
from .._validation import check_job_id, check_queue_name, check_task_name
from ..models import Job
from .filters import (
    RequeueAttempts,
    check_after_id,
    check_age,
    check_limit,
    check_statuses,
    check_tag_filter,
    requeue_resets,
)


@dataclass(frozen=True)
class JobSummary:
    """What every view of a job shows: where it is, where it stands, and when.

    :class:`JobInfo` adds the job's values (payload, error, unique key, result); the
    dashboard's list and job page add bounded previews of them instead, since a page must not
    load megabytes of payload to show a few lines of it.
    """

    id: int
    queue: str
    task: str
    status: str
    priority: int
    attempts: int
    max_attempts: int
    visible_at: datetime
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    cancel_requested: bool


@dataclass(frozen=True)
class JobInfo(JobSummary):
    """A snapshot of one job row, as :meth:`JobQueue.get_job` returns it.

    The fields of :class:`JobSummary`, then the job's values in full.
    """

    payload: Any
    last_error: Any
    unique_key: str | None = None
    #: What the handler returned, for a task that keeps results, once the job succeeded.
    result: Any = None
    #: How each attempt that did not succeed ended, oldest first (the last 20): a list of
    #: dicts with ``attempt``, ``at`` (ISO 8601 text), ``worker``, ``duration`` (seconds),
    #: ``outcome`` and ``error`` (``type``, ``message``, ``traceback``, or None). None until
    #: one has ended so. A success adds no entry: its attempt is the job's own fields.
    attempt_history: Any = None
    #: The worker that runs the job, or ran its last attempt if it succeeded (None otherwise).
    worker: str | None = None
    #: The job's tags, its task's and its enqueue's, in order; None when it has none.
    tags: list[str] | None = None
    #: The job's meta (a dict), its task's with its enqueue's keys over them; None without.
    meta: Any = None
    #: The progress the running attempt's handler last reported (``ctx.report_progress``),
    #: from 0 to 1, as its worker last wrote it; kept once the job finished, cleared when
    #: its next attempt starts. None while none was written.
    progress: float | None = None
    #: That report's message (None: it had none).
    progress_message: str | None = None
    #: When the worker wrote it (database clock).
    progress_at: datetime | None = None


_JOB_INFO_FIELDS: Final = tuple(JobInfo.__dataclass_fields__)
assert set(_JOB_INFO_FIELDS) <= {c.name for c in Job.__table__.columns}


@dataclass(frozen=True)
class Edge:
    """One dependency between two jobs: ``job_id`` waits for ``depends_on``; ``pending`` until
    ``depends_on`` ends; ``on_failure`` is ``"cancel"`` or ``"run"``."""

    job_id: int
    depends_on: int
    on_failure: str
    pending: bool


def job_edges(session: SessionLike, job_id: int) -> tuple[list[Edge], list[Edge]]:
    """What job ``job_id`` waits for, and what waits for it (see :mod:`sa_jobqueue.workflows`)."""
    job_id = check_job_id(job_id)
    rows = connection_of(session).execute(dependencies_sql.edges_of(), {"job_id": job_id})
    edges = [Edge(*row) for row in rows]
    return [e for e in edges if e.job_id == job_id], [e for e in edges if e.job_id != job_id]


def get_job(session: SessionLike, job_id: int) -> JobInfo | None:
    """Read job ``job_id`` as it is in the caller's transaction; None if there is no such id."""
    row = (
        connection_of(session)
        .execute(admin_sql.job_by_id(_JOB_INFO_FIELDS), {"job_id": check_job_id(job_id)})
        .one_or_none()
    )
    return JobInfo(**row._asdict()) if row is not None else None


def list_jobs(
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

    The filters, paging and limits of :meth:`JobQueue.list_jobs`, which calls this: ``queue``,
    ``task``, ``status`` (one or several), ``older_than`` (created longer ago, by the
    database's clock), ``tags`` (jobs carrying every one), ``after_id`` for the next page
    (keyset pagination) and ``newest_first`` for the highest ids first. ``limit`` is at most
    10,000. Bad filters raise InvalidJobError before any SQL is sent.
    """
    params: dict[str, Any] = {"limit": check_limit(limit)}
    if status is not None:
        params["statuses"] = check_statuses(status)
    if queue is not None:
        params["queue"] = check_queue_name(queue)
    if task is not None:
        params["task"] = check_task_name(task)
    if older_than is not None:
        params["older_than"] = check_age(older_than)
    if tags is not None:
        params["tags"] = check_tag_filter(tags)
    if after_id is not None:
        params["after_id"] = check_after_id(after_id)
    statement = select_jobs(
        _JOB_INFO_FIELDS,
        statuses=status is not None,
        queue=queue is not None,
        task=task is not None,
        older_than=older_than is not None,
        after=after_id is not None,
        newest_first=bool(newest_first),
        tags=tags is not None,
    )
    rows = connection_of(session).execute(statement, params)
    return [JobInfo(**row._asdict()) for row in rows]


def count_jobs(session: SessionLike) -> dict[str, dict[str, int]]:
    """Job counts as ``{queue: {status: n}}``; statuses without jobs are left out.

    Reads the whole table, finished history included.
    """
    result: dict[str, dict[str, int]] = {}
    for queue, status, n in connection_of(session).execute(admin_sql.counts()):
        result.setdefault(queue, {})[status] = n
    return result


def cancel_job(session: SessionLike, job_id: int) -> bool:
    """Cancel job ``job_id`` in the caller's transaction; True if it was queued or running.

    A queued job becomes ``cancelled`` and never runs; for a running one cancellation is
    requested, and its worker ends it ``cancelled`` (see :meth:`JobQueue.cancel`). A finished
    job is left as it is (False).
    """
    params = {"job_id": check_job_id(job_id)}
    conn = connection_of(session)
    if conn.execute(admin_sql.cancel_queued(), params).first() is not None:
        return True
    return conn.execute(admin_sql.request_cancel(), params).first() is not None


def requeue_job(session: SessionLike, job_id: int, *, attempts: RequeueAttempts = "extend") -> bool:
    """Put ``dead`` job ``job_id`` back in its queue, due now, in the caller's transaction.

    True if it was dead and is queued again; False (nothing changed) if it is not dead, does
    not exist, or a waiting, queued or running job of its task holds its unique key.
    ``attempts``: "extend" raises ``max_attempts`` by its current value, "reset" starts the
    attempts from 0 again (see :meth:`JobQueue.requeue` for what each keeps of the fencing).
    One NOTIFY wakes the queue's workers at commit.
    """
    reset = requeue_resets(attempts)
    params = {"job_id": check_job_id(job_id)}
    conn = connection_of(session)
    queue = conn.execute(requeue_dead(reset), params).scalar_one_or_none()
    if queue is None:
        return False
    wake(conn, queue)
    return True
