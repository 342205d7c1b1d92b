"""Checks on what callers hand us, run in Python before any SQL is sent.

A rejected job raises a subclass of :class:`~sa_jobqueue.errors.InvalidJobError` and leaves the
caller's transaction exactly as it was, so the caller can fix the input and carry on.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, Final, Literal, get_args

from ._durations import duration_text, value_text
from ._payloads import encode_payload
from .errors import InvalidJobError, InvalidNameError, InvalidScheduleError, PayloadError

QUEUE_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
TASK_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]{0,199}")
PRIORITY_RANGE: Final = range(-32768, 32768)  # the column is a smallint
MAX_ATTEMPTS: Final = 2**31 - 1  # the column is an integer
#: The largest job id: the id column is a bigint.
MAX_JOB_ID: Final = 2**63 - 1
#: Longest delay a job may be scheduled ahead by (a thousand years is "never" in practice and
#: stays far inside PostgreSQL's timestamp range).
MAX_DELAY: Final = timedelta(days=365_000)

#: What an enqueue does when a live job of its task already holds its unique key: ``"skip"``
#: adds nothing; ``"replace"`` gives a queued holder the new payload, priority and due time;
#: ``"debounce"`` does as replace but only ever moves the due time later. A running holder is
#: never touched. See ``docs/how-to/unique-jobs.md``.
UniqueMode = Literal["skip", "replace", "debounce"]
UNIQUE_MODES: Final[tuple[str, ...]] = get_args(UniqueMode)
#: Longest lease. A worker renews leases while the handler runs, so the lease only bounds how
#: long a lost job waits to be reclaimed; a day is already far more than that needs.
MAX_LEASE: Final = timedelta(days=1)


def check_queue_name(name: object) -> str:
    if not isinstance(name, str) or not QUEUE_NAME.fullmatch(name):
        raise InvalidNameError(
            f"invalid queue name {name!r}: use 1-64 characters from A-Z a-z 0-9 _ . : -,"
            " starting with a letter or digit"
        )
    return name


def check_queue_pattern(entry: object) -> str:
    """A queue name, or a pattern of names: ``*`` for any characters, ``?`` for one, each where
    a name's character could stand (queue names have neither, so the two never clash)."""
    # Checked as the name it would be with each wildcard a letter (names start with one).
    as_name = entry.replace("*", "a").replace("?", "a") if isinstance(entry, str) else ""
    if isinstance(entry, str) and len(entry) <= 64 and QUEUE_NAME.fullmatch(as_name):
        return entry
    raise InvalidNameError(
        f"invalid queue {entry!r}: a queue name (1-64 characters from A-Z a-z 0-9 _ . : -),"
        " or a pattern of one with * (any characters) and ? (one character)"
    )


def check_task_name(name: object) -> str:
    if not isinstance(name, str) or not TASK_NAME.fullmatch(name):
        raise InvalidNameError(
            f"invalid task name {name!r}: use 1-200 characters from A-Z a-z 0-9 _ . : -,"
            " starting with a letter or underscore"
        )
    return name


def check_run_at(run_at: datetime | timedelta | None) -> datetime | timedelta | None:
    if isinstance(run_at, datetime):
        if run_at.tzinfo is None or run_at.utcoffset() is None:
            raise InvalidScheduleError(
                "run_at must be timezone-aware (e.g. datetime.now(timezone.utc)); a naive"
                " datetime is ambiguous"
            )
    elif isinstance(run_at, timedelta):
        if not timedelta(0) <= run_at <= MAX_DELAY:
            raise InvalidScheduleError(
                f"run_at as a delay must be from 0s to {duration_text(MAX_DELAY)},"
                f" not {duration_text(run_at)}"
            )
    elif run_at is not None:
        raise InvalidScheduleError(
            f"run_at must be a timezone-aware datetime or a timedelta, not {type(run_at).__name__}"
        )
    return run_at


def check_job_id(job_id: object) -> int:
    """``job_id`` if it is an int the id column can be compared with; InvalidJobError
    otherwise, before the server would refuse it and abort the caller's transaction."""
    if (
        isinstance(job_id, bool)
        or not isinstance(job_id, int)
        or not -MAX_JOB_ID - 1 <= job_id <= MAX_JOB_ID
    ):
        raise InvalidJobError(f"a job id is an int of the id column's range, not {job_id!r}"[:200])
    return job_id


def check_priority(priority: object) -> int:
    if (
        isinstance(priority, bool)
        or not isinstance(priority, int)
        or priority not in PRIORITY_RANGE
    ):
        raise InvalidScheduleError(
            f"priority must be an int from -32768 to 32767, not {value_text(priority)}"
        )
    return priority


def check_max_attempts(max_attempts: object) -> int:
    if (
        isinstance(max_attempts, bool)
        or not isinstance(max_attempts, int)
        or not 1 <= max_attempts <= MAX_ATTEMPTS
    ):
        raise InvalidScheduleError(
            f"max_attempts must be an int from 1 to {MAX_ATTEMPTS}, not {value_text(max_attempts)}"
        )
    return max_attempts


#: Longest unique key, in UTF-8 bytes. A B-tree index entry holds at most about 2,700 bytes, and
#: the key shares its entry with the task name (up to 200); hash anything longer yourself.
MAX_UNIQUE_KEY_BYTES: Final = 1000


def check_unique_key(key: object, *, task: str) -> str | None:
    """A job's unique key: None (no uniqueness) or a str of at most 1,000 UTF-8 bytes."""
    if key is None:
        return None
    if not isinstance(key, str):
        raise InvalidJobError(
            f"task {task!r}: a unique key is a str (or None), not {type(key).__name__}"
        )
    if "\x00" in key:
        raise InvalidJobError(f"task {task!r}: the unique key contains a NUL character")
    try:
        size = len(key.encode())
    except UnicodeEncodeError:
        raise InvalidJobError(f"task {task!r}: the unique key is not valid Unicode") from None
    if size > MAX_UNIQUE_KEY_BYTES:
        raise InvalidJobError(
            f"task {task!r}: the unique key is {size} bytes, over the limit of"
            f" {MAX_UNIQUE_KEY_BYTES}"
        )
    return key


def check_unique_mode(mode: object) -> str:
    if not isinstance(mode, str) or mode not in UNIQUE_MODES:
        raise InvalidJobError(
            f"unique_mode must be one of {', '.join(UNIQUE_MODES)}, not {value_text(mode)}"
        )
    return mode


def check_unique_period(period: object) -> timedelta | None:
    """None, or a whole number of seconds from 1 second to :data:`MAX_DELAY`.

    Whole seconds: the windows are cut from the epoch in the database by integer arithmetic,
    so two transactions compute the very same window start for the same second.
    """
    if period is None:
        return None
    if (
        not isinstance(period, timedelta)
        or not timedelta(seconds=1) <= period <= MAX_DELAY
        or period.microseconds
    ):
        raise InvalidJobError(
            f"unique_period must be a timedelta of whole seconds, from 1s to"
            f" {duration_text(MAX_DELAY)}, not {value_text(period)}"
        )
    return period


def check_lease(lease: object) -> timedelta:
    if not isinstance(lease, timedelta) or not timedelta(0) < lease <= MAX_LEASE:
        raise InvalidScheduleError(
            f"lease must be a timedelta above 0s and at most {duration_text(MAX_LEASE)},"
            f" not {value_text(lease)}"
        )
    return lease


def check_timeout(timeout: object, name: str = "timeout") -> timedelta | None:
    """None (no time limit on an attempt), or a timedelta above 0."""
    if timeout is None:
        return None
    if not isinstance(timeout, timedelta) or timeout <= timedelta(0):
        raise InvalidScheduleError(
            f"{name} must be a timedelta above 0s (or None), not {value_text(timeout)}"
        )
    return timeout


#: A tag: 1 to 64 characters from A-Z a-z 0-9 _ . : - (a queue name's rule), starting with a
#: letter or digit: something to type after ``--tag`` and in a URL without quoting, such as
#: ``billing``, ``customer:42`` or ``v2.1``. Case matters (``Billing`` is another tag).
TAG: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
#: The most tags one job carries, its task's and its enqueue's together: tags label a job for
#: people and filters; data the handler needs belongs in the payload.
MAX_TAGS: Final = 16
#: The largest meta, in bytes of its JSON text: a few fields of context (who, where from,
#: which request), not a payload. 4 KB keeps a row's meta inline or in one TOAST chunk.
MAX_META_BYTES: Final = 4096


def check_tags(tags: object, *, base: tuple[str, ...] = ()) -> tuple[str, ...]:
    """``base`` (the task's tags, checked) with ``tags`` added: in order, without repeats.

    ``tags`` is None or a list, tuple or set of tag strings (a lone str is refused: it would
    be a set of characters). InvalidJobError naming the first bad tag, or the count when the
    two together are over :data:`MAX_TAGS`.
    """
    if tags is None:
        return base
    if isinstance(tags, str | bytes) or not isinstance(tags, list | tuple | set | frozenset):
        raise InvalidJobError(f"tags must be a list of str, not {value_text(tags)}")
    for tag in tags:
        if not isinstance(tag, str) or not TAG.fullmatch(tag):
            raise InvalidJobError(
                f"invalid tag {value_text(tag)}: use 1-64 characters from A-Z a-z 0-9 _ . : -,"
                " starting with a letter or digit"
            )
    given = sorted(tags) if isinstance(tags, set | frozenset) else tags
    merged = tuple(dict.fromkeys((*base, *given)))
    if len(merged) > MAX_TAGS:
        raise InvalidJobError(f"a job has at most {MAX_TAGS} tags, not {len(merged)}")
    return merged


def check_meta(meta: object, *, base: Mapping[str, Any] | None = None) -> str | None:
    """``base`` (the task's meta) with the keys of ``meta`` over it, as the JSON text stored
    with the job; None when both are None or empty.

    InvalidJobError if ``meta`` is not a dict with str keys, or the two together are not JSON
    as payloads are (:func:`encode_payload`'s rules) or are over :data:`MAX_META_BYTES`.
    """
    if meta is not None and not isinstance(meta, Mapping):
        raise InvalidJobError(f"meta must be a dict (a JSON object), not {value_text(meta)}")
    merged = base if meta is None else {**(base or {}), **meta}
    if not merged:
        return None
    try:
        return encode_payload(merged, max_bytes=MAX_META_BYTES)
    except PayloadError as exc:
        message = str(exc)
        raise InvalidJobError("meta" + message.removeprefix("payload")) from None
