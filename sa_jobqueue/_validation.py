"""Checks on what callers hand us, run in Python before any SQL is sent.

A rejected job raises a subclass of :class:`~sa_jobqueue.errors.InvalidJobError` and leaves the
caller's transaction exactly as it was, so the caller can fix the input and carry on.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import sys
from collections.abc import Mapping
from datetime import datetime, timedelta
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any, Final, Literal, get_args

from ._durations import duration_text, value_text
from .errors import InvalidJobError, InvalidNameError, InvalidScheduleError, PayloadError

QUEUE_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
TASK_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]{0,199}")
#: A payload's default size limit, as encoded JSON. A queue row is a message, not a blob store:
#: large inputs belong in a table of their own, referenced by id.
DEFAULT_MAX_PAYLOAD_BYTES: Final = 1_000_000
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

#: How deeply dicts and lists may nest in a payload. A fixed number, not this process's
#: recursion limit: whatever limit the enqueuing process set, every worker must decode what it
#: accepted. The worker's json.loads spends one level of Python's recursion limit (1,000 by
#: default) per level of nesting and starts some dozens of frames deep, and a handler that
#: walks the payload recursively needs room too; 200 leaves most of the limit to them.
#: PostgreSQL's jsonb takes thousands of levels.
MAX_PAYLOAD_DEPTH: Final = 200
#: Longest integer in a payload, in decimal digits: Python's default limit on converting
#: between int and str (``sys.int_info.default_max_str_digits``). A worker decodes with its own
#: process's limit, which is this one unless that process changed it; the enqueuing process's
#: own limit does not matter.
MAX_INT_DIGITS: Final = 4300
_TOO_LONG: Final = 10**MAX_INT_DIGITS  # the smallest integer of one digit too many
#: From here up, Python writes a float with an exponent ("1e+16"), and jsonb's numeric reads
#: that as a whole number of scale 0, which comes back as an int. Smaller floats are written
#: with a decimal point or a negative exponent ("1e-07"), which numeric keeps as a scale
#: ("0.0000001"), so they come back as floats.
_EXPONENT_FROM: Final = 1e16


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


def encode_payload(payload: Any, *, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> str:
    """Return the payload as compact JSON text, or raise PayloadError saying what is wrong.

    A payload that passes reaches the handler equal to what was sent and of the same type at
    every level (floats bit for bit), through PostgreSQL's jsonb and the worker's decoding. Not
    kept: the order of a dict's keys (jsonb sorts them). Refused, with the path of the value:
    what JSON has no form for (sets, bytes, tuples, non-str keys, NaN, infinities, NUL
    characters, lone surrogates), subclasses of JSON's types (an enum arrives as its plain
    value, so pass ``.value``), -0.0 (jsonb's numeric has no negative zero), integers of more
    than :data:`MAX_INT_DIGITS` digits and nesting deeper than :data:`MAX_PAYLOAD_DEPTH`.
    Floats of 1e16 and more, which Python writes with an exponent that jsonb would read as an
    integer, are written out in full with a ``.0`` (``10000000000000000.0``).
    """
    try:
        encoded = _encode(payload)
    except TypeError as exc:  # sets, bytes, datetimes, arbitrary objects
        raise PayloadError(f"payload is not JSON-serialisable: {exc}") from None
    except RecursionError:
        # Deeper than this process's recursion limit lets json encode: the walk says whether
        # it is also deeper than the fixed limit (it stops there, so it cannot recurse away).
        with contextlib.suppress(RecursionError):  # a process with hardly any room left
            _check(payload)
        raise PayloadError(
            "payload is nested too deeply for this process to encode (its recursion limit is"
            f" {sys.getrecursionlimit()})"
        ) from None
    except ValueError as exc:  # circular references, NaN and infinities, overlong integers
        if "Circular" in str(exc):
            raise PayloadError("payload contains a circular reference") from None
        _check(payload)  # raises, naming the value, for NaN, infinities and overlong integers
        raise PayloadError(f"payload cannot be encoded: {exc}") from None
    # One walk checks what json.dumps lets through: keys it turns into strings, tuples and
    # subclasses it turns into plain types, NUL (valid JSON, refused by jsonb), -0.0, overlong
    # integers, nesting, and floats that need writing out. It runs only when the payload is
    # not a flat dict of plain values or the text hints at trouble: a float of 1e16 or more
    # is written with "e+", -0.0 as "-0.0", and an overlong integer needs over 4,300
    # characters. Strings containing these only cost a walk.
    if (
        "\\u0000" in encoded
        or "e+" in encoded
        or "-0.0" in encoded
        or len(encoded) > MAX_INT_DIGITS
        or not _plain(payload)
    ) and _check(payload):
        encoded = _positional(payload)
    try:
        size = len(encoded.encode())
    except UnicodeEncodeError:  # a lone surrogate, e.g. from a badly decoded byte string
        raise PayloadError("payload contains a string that is not valid Unicode") from None
    if size > max_bytes:
        raise PayloadError(f"payload is {size} bytes of JSON, over the limit of {max_bytes}")
    return encoded


#: Compact JSON, characters as they are (the column is UTF-8 text), no NaN. One instance for
#: every payload: ``json.dumps`` with options builds a new encoder each call.
_ENCODER: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
#: ``_ENCODER``'s C encoder, made once (None where the interpreter has none): its ``encode``
#: makes one per call, which costs more than encoding a small payload. This one tracks no
#: cycles (a dict of them shared by threads would not be safe): a cycle recurses until
#: RecursionError, and :func:`_encode` then asks ``_ENCODER``, which says what it is.
_C_ENCODER: Final = (
    None
    if c_make_encoder is None
    else c_make_encoder(
        None, _ENCODER.default, encode_basestring, None, ":", ",", False, False, False
    )
)
_PLAIN_SCALARS: Final = frozenset({str, int, float, bool, type(None)})


def _encode(payload: Any) -> str:
    """``_ENCODER.encode(payload)``, the same text or the same exception, at less cost."""
    if _C_ENCODER is not None:
        try:
            return "".join(_C_ENCODER(payload, 0))
        except RecursionError:
            pass  # a cycle, or nesting too deep: the encoder that tracks cycles says which
    return _ENCODER.encode(payload)


def _plain(value: Any) -> bool:
    """A quick check for the common payload: a dict of str keys and plain scalar values."""
    kind = type(value)
    if kind is dict:
        for key, item in value.items():  # a loop: a generator per call costs as much again
            if type(key) is not str or type(item) not in _PLAIN_SCALARS:
                return False
        return True
    return kind in _PLAIN_SCALARS


def _check(payload: Any) -> bool:
    """Raise PayloadError for the first value that would not arrive intact, naming its path.

    Returns whether some float must be written out in full (see :func:`_positional`).
    """
    try:
        return _walk(payload, 0)
    except _Refusal as refusal:
        path = "payload" + "".join(
            f"[{json.dumps(key, ensure_ascii=False)}]" if isinstance(key, str) else f"[{key}]"
            for key in reversed(refusal.keys)
        )
        raise PayloadError(f"{path} {refusal.message}") from None


class _Refusal(Exception):
    """Raised inside :func:`_walk`; each container on the way out adds its key or index.

    The path is built only for a refused payload, so an accepted one costs no string work.
    """

    def __init__(self, message: str) -> None:
        self.message = message  # what follows the path
        self.keys: list[str | int] = []


def _walk(value: Any, depth: int) -> bool:
    """:func:`_check`'s walk; ``depth`` is the number of containers around ``value``."""
    kind = type(value)
    if kind is str:
        if "\x00" in value:
            raise _Refusal("contains a NUL character, which PostgreSQL cannot store")
        return False
    if kind is dict or kind is list:
        if depth >= MAX_PAYLOAD_DEPTH:
            raise PayloadError(  # not a _Refusal: no path, which would be long and say nothing
                f"payload is nested too deeply: more than {MAX_PAYLOAD_DEPTH} levels of dicts"
                " and lists"
            )
        positional = False
        if kind is dict:
            for key, item in value.items():
                if type(key) is not str:
                    raise _Refusal(
                        f"has a key {key!r} of type {type(key).__name__}; JSON keys"
                        " are plain strings"
                    )
                if "\x00" in key:
                    raise _Refusal("has a key with a NUL character")
                try:
                    positional |= _walk(item, depth + 1)
                except _Refusal as refusal:
                    refusal.keys.append(key)
                    raise
        else:
            for index, item in enumerate(value):
                try:
                    positional |= _walk(item, depth + 1)
                except _Refusal as refusal:
                    refusal.keys.append(index)
                    raise
        return positional
    if kind is float:
        if not math.isfinite(value):
            raise _Refusal(f"is {value}, which JSON cannot carry")
        if value == 0.0 and math.copysign(1.0, value) < 0:
            raise _Refusal(
                "is -0.0: PostgreSQL's jsonb has no negative zero and would hand back 0.0; send 0.0"
            )
        magnitude: float = abs(value)
        return magnitude >= _EXPONENT_FROM
    if kind is int:
        if not -_TOO_LONG < value < _TOO_LONG:
            raise _Refusal(
                f"is an integer of more than {MAX_INT_DIGITS} digits, which a worker"
                " cannot decode (Python's int-string conversion limit); send it as a string"
            )
        return False
    if kind is bool or value is None:
        return False
    if kind is tuple:
        raise _Refusal("is a tuple; JSON would hand it back as a list, so pass a list")
    for base in (bool, int, float, str, dict, list):
        if isinstance(value, base):
            raise _Refusal(
                f"is a {kind.__name__}, which would arrive as a plain {base.__name__};"
                f" pass a {base.__name__} (for an enum, its .value)"
            )
    raise _Refusal(f"is a {kind.__name__}, which JSON cannot carry")


def _positional(value: Any) -> str:
    """The payload's JSON text, as the encoder writes it but for floats of 1e16 and more.

    Those are written in full with one decimal: every float that large is a whole number, so
    the text is its exact value, jsonb's numeric keeps it with its scale of one, and the
    worker's json.loads reads a float again. Only for payloads :func:`_check` has passed.
    """
    parts: list[str] = []
    _write(value, parts)
    return "".join(parts)


def _write(value: Any, parts: list[str]) -> None:
    kind = type(value)
    if kind is float and abs(value) >= _EXPONENT_FROM:
        parts.append(format(value, ".1f"))
    elif kind is dict:
        parts.append("{")
        for index, (key, item) in enumerate(value.items()):
            if index:
                parts.append(",")
            parts.append(_ENCODER.encode(key))
            parts.append(":")
            _write(item, parts)
        parts.append("}")
    elif kind is list:
        parts.append("[")
        for index, item in enumerate(value):
            if index:
                parts.append(",")
            _write(item, parts)
        parts.append("]")
    else:
        parts.append(_ENCODER.encode(value))


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
