"""What the options' values may be: each function reads one option's text or refuses it.

Each is an argparse ``type``: it returns the parsed value or raises ArgumentTypeError with
the reason, which argparse prints after the option's name (``argument --window: ...``).
"""

from __future__ import annotations

import argparse
from datetime import timedelta

from .._durations import as_timedelta, read_seconds
from .._validation import check_queue_name, check_queue_pattern, check_task_name
from ..errors import InvalidLimitError, JobQueueError
from ..models import STATUSES
from ..ops.filters import MAX_PAGE, check_tag_filter
from ..ops.queues import RateLimit, check_cap


def _seconds(value: str) -> float:
    try:
        return read_seconds(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _timedelta(number: float, value: str) -> timedelta:
    try:
        return as_timedelta(number, value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def seconds(value: str) -> timedelta:
    """A duration more than 0: seconds, or with units (``--poll-interval``, ``--watch``)."""
    number = _seconds(value)
    if number <= 0:
        raise argparse.ArgumentTypeError("must be more than 0 seconds")
    return _timedelta(number, value)


def retention(value: str) -> timedelta | None:
    """A duration, 0 or more (seconds, or with units), or ``forever`` (None)."""
    if value == "forever":
        return None
    return _timedelta(_seconds(value), value)


def duration(value: str) -> timedelta:
    """``30s``, ``5m``, ``1m30s``, ``2h``, ``7d``, or a bare number of seconds; 0 is allowed."""
    return _timedelta(_seconds(value), value)


def queues(value: str) -> list[tuple[str, int | None]]:
    """``a,b`` (sharing --concurrency), ``emails=8,reports=1`` (a concurrency each), and
    patterns (``tenant-*``, ``*``) in either form."""
    found: list[tuple[str, int | None]] = []
    for item in filter(None, (part.strip() for part in value.split(","))):
        name, sep, number = item.partition("=")
        try:
            queue = check_queue_pattern(name.strip())
        except JobQueueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if not sep:
            found.append((queue, None))
            continue
        try:
            concurrency = int(number)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a concurrency: {item!r}") from None
        if concurrency < 1:
            raise argparse.ArgumentTypeError(f"a queue's concurrency must be at least 1: {item!r}")
        found.append((queue, concurrency))
    return found


def queues_file(path: str) -> list[tuple[str, int | None]]:
    """A file of queues as ``--queues`` takes them, one or more a line (commas or new lines);
    blank lines and lines starting with ``#`` are skipped."""
    try:
        with open(path, encoding="utf-8") as file:
            lines = file.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {exc}") from None
    kept = [line for line in lines if line.strip() and not line.lstrip().startswith("#")]
    return queues(",".join(kept))


def queue(value: str) -> str:
    """One queue's name, as enqueue would accept it."""
    try:
        return check_queue_name(value)
    except JobQueueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def task(value: str) -> str:
    """One task's name, as enqueue would accept it."""
    try:
        return check_task_name(value)
    except JobQueueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def tag(value: str) -> str:
    """One tag to filter by, under the rule enqueue applies to tags."""
    try:
        return check_tag_filter(value)[0]
    except JobQueueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def statuses(value: str) -> list[str]:
    """Comma-separated job statuses, at least one, each a status a job can have."""
    wanted = [s.strip() for s in value.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in STATUSES]
    if unknown or not wanted:
        raise argparse.ArgumentTypeError(
            f"unknown status {', '.join(unknown) or '(none)'}: use {','.join(STATUSES)}"
        )
    return wanted


def whole(value: str) -> int:
    """A whole number, of any sign."""
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {value!r}") from None


def page(value: str) -> int:
    """Rows at a time, from 1 to the most one statement reads (``--limit``, ``--batch``)."""
    number = whole(value)
    if not 1 <= number <= MAX_PAGE:
        raise argparse.ArgumentTypeError(f"must be from 1 to {MAX_PAGE}")
    return number


def count(value: str) -> int:
    """A whole number, 0 or more (a threshold of ``check``)."""
    number = whole(value)
    if number < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return number


def cap(value: str) -> int:
    """A queue's cap: a whole number from 1 up, as :func:`~sa_jobqueue.ops.set_queue_concurrency`
    accepts it (``--concurrency`` of ``queues limit``)."""
    number = whole(value)
    try:
        check_cap(number)
    except InvalidLimitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return number


def rate(value: str) -> RateLimit:
    """A rate limit, ``N/PERIOD`` (``50/s``, ``1000/h``, ``10/5m``), as
    :meth:`~sa_jobqueue.ops.RateLimit.parse` reads it."""
    try:
        return RateLimit.parse(value)
    except InvalidLimitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def port(value: str) -> int:
    """A TCP port, 0 to 65535 (0: any free one)."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {value!r}") from None
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError("must be from 0 to 65535")
    return number


def key_field(value: str) -> str:
    """The payload field a cap per key reads (``queues limit --key``): 1 to 200 characters."""
    if not 1 <= len(value) <= 200:
        raise argparse.ArgumentTypeError("must be 1 to 200 characters")
    return value
