"""Durations as people write them (``30s``, ``1m30s``, ``7d``): read, and written back.

:func:`read_duration` reads what the CLI's options and the dashboard's filters accept; each
caller turns its ValueError into its own kind of error (argparse's, the dashboard's). Writing:
``str(timedelta(days=1))`` is ``1 day, 0:00:00`` and ``repr(timedelta(0))`` is
``datetime.timedelta(0)``: neither belongs in a message a user reads. :func:`duration_text` and
:func:`value_text` say the same thing in the units read here, exactly, with no rounding,
because a validation message states a limit and must not blur it.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Final

_NUMBER: Final = r"(\d+(?:\.\d*)?|\.\d+)"
_BARE: Final = re.compile(_NUMBER)
_PART: Final = re.compile(_NUMBER + r"(ms|s|m|h|d)")
_UNIT_SECONDS: Final = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_EXAMPLES: Final = "e.g. 30, 500ms, 30s, 1m30s, 2h, 7d"


def read_seconds(value: str) -> float:
    """A bare number of seconds, or amounts with units one after another (``1m30s``).

    ValueError, saying what is accepted, for anything else. Any sign is refused by the
    syntax; whether 0 is allowed is the caller's to say.
    """
    text = value.strip().lower()
    if _BARE.fullmatch(text):
        return float(text)
    if not text:
        raise ValueError(f"not a duration: {value!r} ({_EXAMPLES})")
    total, at = 0.0, 0
    while at < len(text):
        part = _PART.match(text, at)
        if part is None:
            raise ValueError(f"not a duration: {value!r} ({_EXAMPLES})")
        total += float(part[1]) * _UNIT_SECONDS[part[2]]
        at = part.end()
    return total


def as_timedelta(seconds: float, value: str) -> timedelta:
    """``seconds`` (read from ``value``) as a timedelta; ValueError if it is too long for one."""
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise ValueError(f"duration too long: {value!r}") from None


def read_duration(value: str) -> timedelta:
    """``30s``, ``5m``, ``1m30s``, ``2h``, ``7d``, or a bare number of seconds; 0 is allowed.

    ValueError with the reason for anything else.
    """
    return as_timedelta(read_seconds(value), value)


_UNITS: Final = (
    ("d", timedelta(days=1)),
    ("h", timedelta(hours=1)),
    ("m", timedelta(minutes=1)),
)


def duration_text(value: timedelta) -> str:
    """``value`` for people: ``0s``, ``500ms``, ``1.5s``, ``30s``, ``5m``, ``1h30m``, ``1d``.

    Exact: whole units from days down to minutes, then seconds with as many decimals as the
    value has (a value below one second is shown in milliseconds). Negative values get a
    leading ``-``.
    """
    if value < timedelta(0):
        return "-" + duration_text(-value)
    parts: list[str] = []
    rest = value
    for suffix, size in _UNITS:
        count, rest = divmod(rest, size)
        if count:
            parts.append(f"{count}{suffix}")
    if rest or not parts:
        micro = rest // timedelta(microseconds=1)
        if micro and micro < 1_000_000 and not parts:
            parts.append(f"{_decimal(micro, 1_000)}ms")
        else:
            parts.append(f"{_decimal(micro, 1_000_000)}s")
    return "".join(parts)


def _decimal(amount: int, per_unit: int) -> str:
    """``amount / per_unit`` written exactly, without trailing zeros (no float rounding)."""
    whole, fraction = divmod(amount, per_unit)
    if not fraction:
        return str(whole)
    digits = len(str(per_unit)) - 1
    return f"{whole}.{fraction:0{digits}d}".rstrip("0")


def value_text(value: object) -> str:
    """An offending option value as a message shows it: no Python reprs of objects.

    Durations as :func:`duration_text`, datetimes in ISO 8601, numbers and strings as
    written, anything else by the name of its type ("a dict").
    """
    if isinstance(value, timedelta):
        return duration_text(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if value is None or isinstance(value, bool | int | float):
        return str(value)
    if isinstance(value, str):
        shown = value if len(value) <= 60 else value[:57] + "..."
        return f"'{shown}'"
    return f"a {type(value).__name__}"
