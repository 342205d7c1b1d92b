"""The filters callers give when they read, requeue or purge jobs, checked before any SQL.

:class:`~sa_jobqueue.queue.JobQueue` (``list_jobs``, ``requeue``) and
:mod:`sa_jobqueue.testing` use these with the statements of :mod:`sa_jobqueue._sql.listing`
and :mod:`sa_jobqueue._sql.finished`, which this module also makes available under the names
those callers use.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Final

from .._sql.finished import requeue_dead
from .._sql.listing import select_jobs
from ..errors import InvalidJobError
from ..models import STATUSES

__all__ = ["MAX_PAGE", "check_age", "check_limit", "check_statuses", "requeue_dead", "select_jobs"]

#: The most rows one call of :meth:`JobQueue.list_jobs` returns, and the largest purge batch.
MAX_PAGE: Final = 10_000


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


def check_limit(limit: object, name: str = "limit") -> int:
    """``limit`` if it is an int from 1 to :data:`MAX_PAGE`; InvalidJobError otherwise."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise InvalidJobError(f"{name} must be an int from 1 to {MAX_PAGE}, not {limit!r}")
    return limit


def check_age(age: object, name: str = "older_than") -> float:
    """A non-negative timedelta, as seconds for :func:`~sa_jobqueue._sql.clock.seconds`."""
    if not isinstance(age, timedelta) or age < timedelta(0):
        raise InvalidJobError(f"{name} must be a timedelta of 0 or more, not {age!r}")
    return age.total_seconds()
