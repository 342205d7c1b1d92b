"""The job page's table of attempts: the entries of ``attempt_history``, then the row's own."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..models import RUNNING, SUCCEEDED


@dataclass(frozen=True)
class AttemptRow:
    """One attempt as the job page shows it: text as read (cut in the database), ``at`` a
    datetime when it reads as one. Nothing here is trusted to have the shape workers write."""

    attempt: str
    outcome: str
    at: datetime | str | None
    worker: str | None
    #: Seconds, when the entry's duration is a number.
    duration: float | None
    error_type: str | None = None
    message: str | None = None
    message_length: int | None = None
    traceback: str | None = None
    traceback_length: int | None = None


def _moment(value: object) -> datetime | str | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return value


def _number(value: object) -> float | None:
    try:
        return float(str(value))
    except ValueError:
        return None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) else None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def attempt_rows(
    entries: list[Any] | None,
    *,
    status: str,
    attempts: int,
    worker: str | None,
    started_at: datetime | None,
    finished_at: datetime | None,
) -> list[AttemptRow]:
    """The entries (as ``dashboard.job_detail`` reads them), then the job's own attempt if
    it succeeded (a success leaves no entry) or is running."""
    rows = [
        AttemptRow(
            attempt=str(e.get("attempt") or "?"),
            outcome=str(e.get("outcome") or "?"),
            at=_moment(e.get("at")),
            worker=_text(e.get("worker")),
            duration=_number(e.get("duration")),
            error_type=_text(e.get("error_type")),
            message=_text(e.get("message")),
            message_length=_int(e.get("message_length")),
            traceback=_text(e.get("traceback")),
            traceback_length=_int(e.get("traceback_length")),
        )
        for e in entries or ()
        if isinstance(e, dict)
    ]
    if status in (SUCCEEDED, RUNNING) and attempts and started_at is not None:
        took = None if finished_at is None else (finished_at - started_at).total_seconds()
        rows.append(AttemptRow(str(attempts), status, finished_at or started_at, worker, took))
    return rows
