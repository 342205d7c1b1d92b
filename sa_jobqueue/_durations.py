"""Durations and other option values as people read them, for one-line error messages.

``str(timedelta(days=1))`` is ``1 day, 0:00:00`` and ``repr(timedelta(0))`` is
``datetime.timedelta(0)``: neither belongs in a message a user reads. These helpers say the same
thing in the units the CLI accepts (``30s``, ``5m``, ``2h``, ``7d``), exactly, with no rounding,
because a validation message states a limit and must not blur it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Final

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
