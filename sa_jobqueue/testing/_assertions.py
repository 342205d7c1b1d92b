"""Assertions on the jobs your code enqueued, read in your transaction.

Internal to :mod:`sa_jobqueue.testing`, which exports :func:`enqueued_jobs`,
:func:`assert_enqueued` and :func:`refute_enqueued`; may change without notice.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any, Final
from unittest.mock import ANY

from sqlalchemy import Engine

from .._binds import SessionLike
from .._payload_types import PayloadCodec
from .._sql.listing import select_jobs
from .._validation import check_queue_name
from ..errors import InvalidJobError, PayloadTypeError
from ..models import QUEUED
from ..ops.filters import MAX_PAGE, check_statuses
from ..queue import JobInfo
from ..tasks import Task
from ._reading import JOB_FIELDS, reading

#: Jobs an assertion message lists at most.
_SHOWN: Final = 20


def enqueued_jobs(
    session: Engine | SessionLike,
    *,
    task: str | Task | None = None,
    payload: Any = ANY,
    queue: str | None = None,
    status: str | Iterable[str] | None = QUEUED,
) -> list[JobInfo]:
    """The jobs matching all the filters given, in id order, read in the caller's transaction.

    A Session or Connection sees what its own transaction enqueued before committing; an
    Engine sees committed jobs. ``payload`` must equal (``==``) the job's payload as a worker
    would decode it; ``unittest.mock.ANY`` matches any value, also inside a dict or list
    (``{"user_id": 1, "token": ANY}``). For a task with a typed payload given as a Task object,
    that is a value of its type (``Order(id=7)``, ``Order(id=ANY)``); its stored JSON matches
    too. Given by name, the task's type is not known here, and only the JSON can match.
    ``status`` defaults to ``"queued"``; None means any status. Reads at most 10,000 jobs.
    """
    params: dict[str, Any] = {"limit": MAX_PAGE}
    if status is not None:
        params["statuses"] = check_statuses(status)
    if queue is not None:
        params["queue"] = check_queue_name(queue)
    if task is not None:
        params["task"] = task.name if isinstance(task, Task) else task
    statement = select_jobs(
        JOB_FIELDS,
        statuses=status is not None,
        queue=queue is not None,
        task=task is not None,
        older_than=False,
        after=False,
    )
    codec = task.payload_codec if isinstance(task, Task) else None
    with reading(session) as conn:
        rows = conn.execute(statement, params)
        return [
            info
            for info in (JobInfo(**row._asdict()) for row in rows)
            if payload is ANY or payload == info.payload or _decoded_equal(codec, payload, info)
        ]


def _decoded_equal(codec: PayloadCodec | None, payload: Any, job: JobInfo) -> bool:
    """Whether ``payload`` equals ``job``'s payload as a worker rebuilds it with ``codec`` (a
    stored payload that no longer fits the type equals nothing)."""
    if codec is None:
        return False
    try:
        return bool(payload == codec.rebuild(job.payload))
    except PayloadTypeError:
        return False


def assert_enqueued(
    session: Engine | SessionLike,
    *,
    task: str | Task | None = None,
    payload: Any = ANY,
    queue: str | None = None,
    status: str | Iterable[str] | None = QUEUED,
    count: int | None = None,
) -> JobInfo:
    """Assert that a job matching the filters exists (exactly ``count`` of them, if given).

    Filters as :func:`enqueued_jobs`. Returns the newest matching job. On failure, raises
    AssertionError listing the jobs of that status that were found instead.
    """
    __tracebackhide__ = True
    if count is not None and (isinstance(count, bool) or count < 1):
        raise InvalidJobError(f"count must be at least 1 (for none, refute_enqueued), not {count}")
    found = enqueued_jobs(session, task=task, payload=payload, queue=queue, status=status)
    if found and (count is None or len(found) == count):
        return found[-1]
    wanted = _describe(task, payload, queue, status)
    expected = f"a {wanted}" if count is None else f"{count} of ({wanted})"
    if found:  # the wrong number of them
        raise AssertionError(
            f"expected {expected}, found {len(found)}:\n{_listing(found, len(found))}"
        )
    others = enqueued_jobs(session, status=status)
    kind = "jobs" if status is None else f"{_statuses(status)} jobs"
    seen = f"{kind} found:\n{_listing(others, len(others))}" if others else f"no {kind} at all"
    raise AssertionError(f"expected {expected}, found none; {seen}")


def refute_enqueued(
    session: Engine | SessionLike,
    *,
    task: str | Task | None = None,
    payload: Any = ANY,
    queue: str | None = None,
    status: str | Iterable[str] | None = QUEUED,
) -> None:
    """Assert that no job matches the filters (as :func:`enqueued_jobs`); list those that do."""
    __tracebackhide__ = True
    found = enqueued_jobs(session, task=task, payload=payload, queue=queue, status=status)
    if found:
        wanted = _describe(task, payload, queue, status)
        raise AssertionError(
            f"expected no {wanted}, found {len(found)}:\n{_listing(found, len(found))}"
        )


def _describe(
    task: str | Task | None, payload: Any, queue: str | None, status: str | Iterable[str] | None
) -> str:
    parts = ["job" if status is None else f"{_statuses(status)} job"]
    if task is not None:
        parts.append(f"of task {task.name if isinstance(task, Task) else task!r}")
    if queue is not None:
        parts.append(f"in queue {queue!r}")
    if payload is not ANY:
        parts.append(f"with payload {payload!r}")
    return " ".join(parts)


def _statuses(status: str | Iterable[str]) -> str:
    return status if isinstance(status, str) else "/".join(status)


def _listing(jobs: Collection[JobInfo], total: int) -> str:
    lines = [
        f"  #{job.id} {job.task} queue={job.queue!r} status={job.status} payload={job.payload!r}"
        for job in list(jobs)[:_SHOWN]
    ]
    if total > _SHOWN:
        lines.append(f"  ... and {total - _SHOWN} more")
    return "\n".join(lines)
