"""The filters callers give when they read, requeue or purge jobs, checked before any SQL.

Job admin (:mod:`sa_jobqueue.ops.admin`), purging, stats, health checks, the worker registry
and :mod:`sa_jobqueue.testing` check their arguments here, so each filter is refused with the
same typed error wherever it is given.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Final, Literal

from .._durations import duration_text, value_text
from .._validation import MAX_DELAY, check_job_id, check_tags
from .._validation import MAX_JOB_ID as MAX_JOB_ID  # where ops and the dashboard read it
from ..errors import InvalidJobError
from ..models import STATUSES

#: The most rows one call of :meth:`JobQueue.list_jobs` returns, and the largest purge batch.
MAX_PAGE: Final = 10_000
#: The longest queue and task names the table holds (its columns' lengths).
NAME_LENGTHS: Final = {"queue": 64, "task": 200}
#: The most job ids one call acting on chosen jobs takes (:mod:`sa_jobqueue.ops.bulk`): the
#: dashboard's longest page (500 rows) twice over, sent as one array parameter of a few
#: kilobytes, and no more than one batch of those calls changes, so a call by ids and a call
#: by filter hold locks for as long.
MAX_IDS: Final = 1_000


def check_statuses(statuses: str | Iterable[str]) -> list[str]:
    """The statuses as a list; InvalidJobError naming the valid ones if any is unknown."""
    wanted = [statuses] if isinstance(statuses, str) else list(statuses)
    unknown = [s for s in wanted if s not in STATUSES]
    if unknown or not wanted:
        raise InvalidJobError(
            f"unknown status {', '.join(map(repr, unknown)) or 'list (empty)'}:"
            f" expected one or more of {', '.join(STATUSES)}"
        )
    return wanted


def check_name_filter(name: object, what: Literal["queue", "task"]) -> str:
    """A queue or task name to match rows by: 1 to :data:`NAME_LENGTHS` characters, no NUL.

    Looser than the names ``enqueue`` accepts: a row written some other way can still be
    found. The name only ever reaches the database as a bound parameter.
    """
    longest = NAME_LENGTHS[what]
    if not isinstance(name, str) or not 1 <= len(name) <= longest or "\x00" in name:
        raise InvalidJobError(f"a {what} name is 1 to {longest} characters, with no NUL")
    return name


def check_tag_filter(tags: str | Iterable[str]) -> list[str]:
    """Tags to list jobs by (the jobs carrying every one of them): one tag, or 1 to
    :data:`~sa_jobqueue._validation.MAX_TAGS` of them, each under the rule ``enqueue`` applies
    (so a tag no job can carry is refused rather than matching nothing); repeats dropped.
    InvalidJobError otherwise. The CLI's ``--tag``, the dashboard's and the API's ``tag``
    parameters and :meth:`JobQueue.list_jobs` all check them here."""
    wanted = [tags] if isinstance(tags, str) else tags
    checked = list(check_tags(wanted if isinstance(wanted, list | tuple) else list(wanted)))
    if not checked:
        raise InvalidJobError("give one tag or more to filter by, not an empty list")
    return checked


def check_limit(limit: object, name: str = "limit") -> int:
    """``limit`` if it is an int from 1 to :data:`MAX_PAGE`; InvalidJobError otherwise."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise InvalidJobError(
            f"{name} must be an int from 1 to {MAX_PAGE}, not {value_text(limit)}"
        )
    return limit


#: What a requeue of dead or cancelled jobs does with the attempts they made: "extend" keeps
#: them and raises ``max_attempts`` by its current value (as many tries again), "reset" starts
#: the count again from 0. The one definition: the Python API, the CLI, the dashboard and its
#: JSON API all take these words.
RequeueAttempts = Literal["extend", "reset"]
REQUEUE_ATTEMPTS: Final[tuple[RequeueAttempts, ...]] = ("extend", "reset")


def requeue_attempts(attempts: object) -> RequeueAttempts:
    """``attempts`` as a requeue's mode (:data:`RequeueAttempts`); InvalidJobError for anything
    else."""
    for mode in REQUEUE_ATTEMPTS:
        if attempts == mode:
            return mode
    raise InvalidJobError(f"attempts must be 'extend' or 'reset', not {attempts!r}")


def requeue_resets(attempts: object) -> bool:
    """Whether a requeue's ``attempts`` mode is "reset" (True) or "extend" (False);
    InvalidJobError for anything else."""
    return requeue_attempts(attempts) == "reset"


def check_ids(ids: object) -> list[int]:
    """``ids`` as a sorted list without repeats: 1 to :data:`MAX_IDS` job ids (ints);
    InvalidJobError otherwise, before the server would refuse them."""
    if isinstance(ids, str | bytes) or not isinstance(ids, Iterable):
        raise InvalidJobError(f"ids must be a collection of job ids, not {value_text(ids)}")
    wanted = list(ids)
    for one in wanted:
        if isinstance(one, bool) or not isinstance(one, int) or not 0 < one <= MAX_JOB_ID:
            raise InvalidJobError(f"a job id is a positive int, not {one!r}")
    unique = sorted(set(wanted))
    if not 1 <= len(unique) <= MAX_IDS:
        raise InvalidJobError(f"give 1 to {MAX_IDS:,} job ids, not {len(unique):,}")
    return unique


def check_after_id(after_id: object) -> int:
    """``after_id`` (where a page or a batch starts: past that id) if it is an int the id
    column can be compared with; InvalidJobError otherwise, before the server would refuse it
    and abort the caller's transaction."""
    try:
        return check_job_id(after_id)
    except InvalidJobError:
        raise InvalidJobError(f"after_id must be a job id (an int), not {after_id!r}") from None


def check_age(age: object, name: str = "older_than") -> float:
    """A timedelta from 0 to :data:`~sa_jobqueue._validation.MAX_DELAY`, as seconds for
    :func:`~sa_jobqueue._sql.clock.seconds`.

    Bounded because the statements compare with ``now()`` minus it, which the server refuses
    (aborting the caller's transaction) past its timestamps' range; a thousand years already
    reaches back past every job.
    """
    if not isinstance(age, timedelta) or age < timedelta(0):
        raise InvalidJobError(f"{name} must be a timedelta of 0s or more, not {value_text(age)}")
    if age > MAX_DELAY:
        raise InvalidJobError(
            f"{name} must be a timedelta of at most {duration_text(MAX_DELAY)},"
            f" not {value_text(age)}"
        )
    return age.total_seconds()


def filter_params(
    queue: str | None, task: str | None, older_than: timedelta | None
) -> tuple[dict[str, object], dict[str, bool]]:
    """The checked bind parameters (``b_queue``, ``b_task``, ``b_older_than``) of the filters
    a call gave, and which were given (the flags its statement builder takes); names are
    checked by :func:`check_name_filter`, the age by :func:`check_age`."""
    params: dict[str, object] = {}
    if queue is not None:
        params["b_queue"] = check_name_filter(queue, "queue")
    if task is not None:
        params["b_task"] = check_name_filter(task, "task")
    if older_than is not None:
        params["b_older_than"] = check_age(older_than)
    flags = {"queue": queue is not None, "task": task is not None}
    flags["older_than"] = older_than is not None
    return params, flags
