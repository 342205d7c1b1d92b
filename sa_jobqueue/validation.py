"""Checks on what callers hand us, run in Python before any SQL is sent.

A rejected job raises a subclass of :class:`~sa_jobqueue.errors.InvalidJobError` and leaves the
caller's transaction exactly as it was, so the caller can fix the input and carry on.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime, timedelta
from typing import Any, Final

from .errors import InvalidJobError, InvalidNameError, InvalidScheduleError, PayloadError

QUEUE_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
TASK_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]{0,199}")
#: A payload's default size limit, as encoded JSON. A queue row is a message, not a blob store:
#: large inputs belong in a table of their own, referenced by id.
DEFAULT_MAX_PAYLOAD_BYTES: Final = 1_000_000
PRIORITY_RANGE: Final = range(-32768, 32768)  # the column is a smallint
MAX_ATTEMPTS: Final = 2**31 - 1  # the column is an integer
#: Longest delay a job may be scheduled ahead by (a thousand years is "never" in practice and
#: stays far inside PostgreSQL's timestamp range).
MAX_DELAY: Final = timedelta(days=365_000)
#: Longest lease. A worker renews leases while the handler runs, so the lease only bounds how
#: long a lost job waits to be reclaimed; a day is already far more than that needs.
MAX_LEASE: Final = timedelta(days=1)

_JSON_SCALARS: Final = (str, int, float, bool, type(None))


def check_queue_name(name: object) -> str:
    if not isinstance(name, str) or not QUEUE_NAME.fullmatch(name):
        raise InvalidNameError(
            f"invalid queue name {name!r}: use 1-64 characters from A-Z a-z 0-9 _ . : -,"
            " starting with a letter or digit"
        )
    return name


def check_task_name(name: object) -> str:
    if not isinstance(name, str) or not TASK_NAME.fullmatch(name):
        raise InvalidNameError(
            f"invalid task name {name!r}: use 1-200 characters from A-Z a-z 0-9 _ . : -,"
            " starting with a letter or underscore"
        )
    return name


def encode_payload(payload: Any, *, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> str:
    """Return the payload as compact JSON text, or raise PayloadError saying what is wrong."""
    try:
        encoded = json.dumps(payload, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except TypeError as exc:  # sets, bytes, datetimes, arbitrary objects
        raise PayloadError(f"payload is not JSON-serialisable: {exc}") from None
    except RecursionError:
        raise PayloadError("payload is nested too deeply") from None
    except ValueError as exc:  # circular references, NaN and infinities
        message = str(exc)
        if "Circular" in message:
            raise PayloadError("payload contains a circular reference") from None
        raise PayloadError("payload contains NaN or Infinity, which JSON cannot carry") from None
    # json.dumps quietly turns int/float/bool/None keys into strings and tuples into lists; the
    # worker would then get back something else than was sent. "\u0000" is valid JSON but
    # PostgreSQL's jsonb refuses it. One walk checks both, only when the cheap test hints at them.
    if "\\u0000" in encoded or not _plain(payload):
        _walk(payload)
    try:
        size = len(encoded.encode())
    except UnicodeEncodeError:  # a lone surrogate, e.g. from a badly decoded byte string
        raise PayloadError("payload contains a string that is not valid Unicode") from None
    if size > max_bytes:
        raise PayloadError(f"payload is {size} bytes of JSON, over the limit of {max_bytes}")
    return encoded


def _plain(value: Any) -> bool:
    """A quick check that the top level holds only str keys (the common case for payloads)."""
    if isinstance(value, dict):
        return all(isinstance(k, str) for k in value) and not any(
            isinstance(v, dict | list | tuple) for v in value.values()
        )
    return isinstance(value, _JSON_SCALARS)


def _walk(value: Any, path: str = "payload") -> None:
    if isinstance(value, str):
        if "\x00" in value:
            raise PayloadError(f"{path} contains a NUL character, which PostgreSQL cannot store")
    elif isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise PayloadError(f"{path} has a non-string key {key!r}; JSON keys are strings")
            if "\x00" in key:
                raise PayloadError(f"{path} has a key with a NUL character")
            _walk(item, f"{path}[{key!r}]")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _walk(item, f"{path}[{index}]")
    elif isinstance(value, tuple):
        raise PayloadError(f"{path} is a tuple; JSON would hand it back as a list, so pass a list")
    elif isinstance(value, float) and not math.isfinite(value):  # pragma: no cover - dumps caught
        raise PayloadError(f"{path} is {value}, which JSON cannot carry")


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
                f"run_at as a delay must be from 0 to {MAX_DELAY.days} days, not {run_at}"
            )
    elif run_at is not None:
        raise InvalidScheduleError(
            f"run_at must be a timezone-aware datetime or a timedelta, not {type(run_at).__name__}"
        )
    return run_at


def check_priority(priority: object) -> int:
    if (
        isinstance(priority, bool)
        or not isinstance(priority, int)
        or priority not in PRIORITY_RANGE
    ):
        raise InvalidScheduleError(
            f"priority must be an int from -32768 to 32767, not {priority!r}"
        )
    return priority


def check_max_attempts(max_attempts: object) -> int:
    if (
        isinstance(max_attempts, bool)
        or not isinstance(max_attempts, int)
        or not 1 <= max_attempts <= MAX_ATTEMPTS
    ):
        raise InvalidScheduleError(
            f"max_attempts must be an int from 1 to {MAX_ATTEMPTS}, not {max_attempts!r}"
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


def check_lease(lease: object) -> timedelta:
    if not isinstance(lease, timedelta) or not timedelta(0) < lease <= MAX_LEASE:
        raise InvalidScheduleError(
            f"lease must be a timedelta above 0 and at most {MAX_LEASE}, not {lease!r}"
        )
    return lease
