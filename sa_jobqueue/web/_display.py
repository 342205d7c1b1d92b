"""How values look on the pages: times relative and absolute, control characters, long text.

Pure functions, registered as the templates' filters; nothing here escapes HTML but
:func:`minute_chart`, which returns markup. Jinja2's autoescaping does the rest, after
:func:`visible` (the environment's ``finalize``) has made every control character visible.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from markupsafe import Markup, escape

from .._visible import visible as shown
from ..ops.health import span

#: Deepest JSON re-indented for display; deeper (possible in jsonb, not through enqueue) is
#: shown as the database wrote it. Python's json module spends a frame per level.
MAX_INDENT_DEPTH: Final = 200


def visible(value: Any) -> Any:
    """A string with each control character written as ``\\xNN`` or ``\\uNNNN``; else as is.

    Markup (a macro's output, already made of finalized and escaped values) passes unchanged.
    The same function as the CLI's and the logs' (:func:`sa_jobqueue._visible.visible`).
    """
    if not isinstance(value, str) or isinstance(value, Markup):
        return value
    return shown(value)


def absolute(moment: datetime | None) -> str:
    """``2026-11-22 14:03:07 UTC``: the moment in the database session's time zone."""
    if moment is None:
        return "-"
    zone = moment.strftime("%Z") or moment.strftime("%z")
    return f"{moment:%Y-%m-%d %H:%M:%S} {zone}".rstrip()


def relative(moment: datetime | None, now: datetime) -> str:
    """``3m12s ago`` or ``in 5s``, from the database's ``now``."""
    if moment is None:
        return "-"
    offset = moment - now
    if abs(offset) < timedelta(seconds=1):
        return "now"
    return f"in {span(offset)}" if offset > timedelta(0) else f"{span(-offset)} ago"


def duration(value: timedelta | None) -> str:
    """A duration for people (``12m03s``), ``-`` for none."""
    return "-" if value is None else span(value)


def count(value: int) -> str:
    """``1,204,311``."""
    return f"{value:,}"


def first_line(text: str | None) -> str:
    """The first line of an error message (what a list has room for)."""
    if not text:
        return ""
    lines = text.strip().splitlines()
    return lines[0] if lines else ""


def json_text(text: str | None, length: int | None) -> str:
    """JSON from the database as text to show: re-indented when it came whole and is shallow.

    ``text`` may be the first characters of a longer document (``length`` is the whole one's):
    that, or nesting deeper than :data:`MAX_INDENT_DEPTH`, is shown as the database wrote it.
    """
    if text is None:
        return "null"
    if length is not None and length > len(text):
        return text
    if _depth(text) > MAX_INDENT_DEPTH:
        return text
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except (ValueError, RecursionError):
        return text


def _depth(text: str) -> int:
    """How deeply brackets nest in JSON text (strings skipped), without parsing it."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def cut_note(shown: str | None, length: int | None) -> str:
    """``first 65,536 of 1,048,600 characters`` when ``shown`` is part of ``length``; else ""."""
    if shown is None or length is None or length <= len(shown):
        return ""
    return f"first {len(shown):,} of {length:,} characters"


# -- the throughput chart --------------------------------------------------------------------

#: The chart's size in SVG user units: one bar per minute, 3 wide with a gap of 1.
BAR_STEP: Final = 4
BAR_WIDTH: Final = 3
CHART_HEIGHT: Final = 32


@dataclass(frozen=True, slots=True)
class Bar:
    """One status's part of one minute's bar, in SVG coordinates."""

    x: int
    y: float
    height: float
    status: str
    count: int
    #: Minutes before now at which the minute ends (0: the last minute).
    minutes_ago: int


def _stacked(
    per_minute: Mapping[str, Sequence[int]], scale: int
) -> Iterator[tuple[int, float, float, str, int]]:
    """Each status's part of each minute's bar, minute by minute, oldest first: its minute's
    index, its top and height in SVG units (the first status at the bottom), its status and
    its count. Nothing when ``scale`` (the count of a full-height bar) is not positive."""
    if scale <= 0:
        return
    minutes = max((len(v) for v in per_minute.values()), default=0)
    for i in range(minutes):
        base = float(CHART_HEIGHT)
        for status, counts in per_minute.items():
            n = counts[i]
            if n:
                height = max(CHART_HEIGHT * n / scale, 1.0)
                base -= height
                yield i, base, height, status, n


def chart(per_minute: Mapping[str, Sequence[int]], scale: int) -> list[Bar]:
    """The stacked bars of a queue's finished jobs per minute, oldest minute on the left.

    ``scale`` is the count a full-height bar stands for (the busiest minute's, usually).
    """
    minutes = max((len(v) for v in per_minute.values()), default=0)
    return [
        Bar(i * BAR_STEP, round(top, 2), round(height, 2), status, n, minutes - 1 - i)
        for i, top, height, status, n in _stacked(per_minute, scale)
    ]


def minute_chart(per_minute: Mapping[str, Sequence[int]], scale: int) -> Markup:
    """The overview's chart of one queue's last hour: :func:`chart`'s stacked bars as an SVG
    element, one path per status, titled with the status's count for the hour.

    A page of a hundred busy queues has up to 18,000 bars: drawn as an element each, with a
    tooltip each, through the template (which escapes each of their values one by one), they
    took most of the page's time. Here each bar is a few characters of a path, and every
    value a number or a status of our own (escaped all the same, once per status). The queue
    page's charts keep a tooltip per bar.
    """
    steps: dict[str, list[str]] = {status: [] for status in per_minute}  # in their order
    for i, top, height, status, _ in _stacked(per_minute, scale):
        steps[status].append(f"M{i * BAR_STEP} {top:.2f}h{BAR_WIDTH}v{height:.2f}h-{BAR_WIDTH}z")
    paths = []
    for status, parts in steps.items():
        if not parts:
            continue
        name = escape(status)
        paths.append(
            f'<path d="{"".join(parts)}" class="bar-{name}">'
            f"<title>{sum(per_minute[status]):,} {name} in the last hour</title></path>"
        )
    return Markup(
        '<svg class="chart" viewBox="0 0 240 32" width="240" height="32" role="img"'
        ' aria-label="jobs finished per minute in the last hour">'
        f'<line x1="0" y1="31.5" x2="240" y2="31.5" class="axis"/>{"".join(paths)}</svg>'
    )


FILTERS: Final = {
    "absolute": absolute,
    "count": count,
    "cut_note": cut_note,
    "duration": duration,
    "first_line": first_line,
    "json_text": json_text,
}
