"""Text tables and JSON, the two forms of every ``sa-jobqueue`` command's output.

Each command renders its own results (``_jobs``, ``_queues``, ``_stats``, ``_check``,
``_workflows``) with these; nothing here touches the database. Times are shown relative to the
database's ``now()``, which the caller passes in. The text layout is for people and may change;
the JSON is for programs: durations in seconds, times in ISO 8601.

Text from the rows (names, payloads, errors) is shown with its control characters written out
(:func:`~sa_jobqueue._visible.visible`): a terminal shows ``\x1b[2J``, it does not clear.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from .._visible import json_visible, visible


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], right: int = 0) -> str:
    """Columns padded to their widest cell; the last ``right`` columns aligned right.

    Each cell stays on its line: its control characters, line feeds and tabs are written out.
    """
    cells = [
        [str(c) for c in headers],
        *([visible(str(c), lines=False) for c in row] for row in rows),
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    first_right = len(headers) - right
    lines = [
        "  ".join(
            cell.rjust(width) if i >= first_right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in cells
    ]
    return "\n".join(lines)


# -- JSON ------------------------------------------------------------------------------------


def plain(value: Any) -> Any:
    """Dataclasses, dicts, lists, times and durations as what :mod:`json` writes."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    return value


def to_json(value: Any, indent: int | None = 2) -> str:
    """Dataclasses, lists and dicts of them as JSON (timedeltas as seconds).

    Non-ASCII text stays as it is, but for the characters a terminal would obey (DEL, C1,
    bidirectional controls, which ``json.dumps`` leaves raw): those are ``\\uNNNN`` escapes.
    """
    return json_visible(json.dumps(plain(value), indent=indent, ensure_ascii=False))
