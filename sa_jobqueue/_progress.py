"""A handler's progress report: what ``report_progress`` checks and keeps, in memory only.

The call stores the report on the attempt's context and returns; the worker's heartbeat
writes the latest one with its next lease renewal (``worker/_progress.py``). Nothing here does
I/O, and nothing here takes a lock: the handler's thread replaces the report with one
reference assignment, and the heartbeat's thread reads that reference and remembers which one
it wrote, so a report is never seen half made, and one made while a write is under way is
simply written the next time.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Final, NamedTuple

from ._durations import value_text
from .errors import InvalidProgressError

#: Longest progress message, in characters: a line for a dashboard or ``jobs show`` ("4,200 of
#: 10,000 rows"), not a log. Whatever its length, a report replaces the last one in its row,
#: so a job's progress never costs more than this in its row.
MAX_PROGRESS_MESSAGE: Final = 200


class ProgressReport(NamedTuple):
    """One report: a fraction from 0 to 1, and an optional message."""

    fraction: float
    message: str | None


def check_progress(fraction: object, message: object) -> ProgressReport:
    """The report, checked; :class:`~sa_jobqueue.errors.InvalidProgressError` if it is not valid.

    A message the database could not store (a NUL character, an unpaired surrogate) is refused
    here, at the call, rather than found out when it is written, where it would stop the
    lease renewal it rides with.
    """
    if isinstance(fraction, bool) or not isinstance(fraction, Real):
        raise InvalidProgressError(
            f"progress is a fraction from 0 to 1 (a float), not {value_text(fraction)}"
        )
    value = float(fraction)
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise InvalidProgressError(f"progress is a fraction from 0 to 1, not {value!r}")
    if message is None:
        return ProgressReport(value, None)
    if not isinstance(message, str):
        raise InvalidProgressError(f"a progress message is a str, not {value_text(message)}")
    if len(message) > MAX_PROGRESS_MESSAGE:
        raise InvalidProgressError(
            f"a progress message is at most {MAX_PROGRESS_MESSAGE} characters, not {len(message)}"
        )
    if "\x00" in message:
        raise InvalidProgressError("a progress message cannot hold a NUL character")
    try:
        message.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidProgressError(
            "a progress message must be encodable as UTF-8 (it holds an unpaired surrogate)"
        ) from None
    return ProgressReport(value, message)
