"""The entry a fenced transition appends to a job's ``attempt_history``, and the bound on it.

Every statement that ends a running attempt other than by success (a failure, a Discard, a
Retry, a release at shutdown, a cancellation, a lease found expired at the next claim) sets
``attempt_history`` to :func:`appended`, in the same UPDATE, so an entry is written exactly
when that statement's fence matches: a stale attempt's write matches no row and appends
nothing. Successes add nothing, and their statements are unchanged: a succeeded job's last
attempt is the row itself (``attempts``, ``worker``, ``started_at``, ``finished_at``).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, Numeric, case, cast, func, literal, literal_column, null
from sqlalchemy.dialects.postgresql import JSONB

from ..models import ATTEMPT_HISTORY_LIMIT, jobs_table

j = jobs_table.c


def appended(outcome: ColumnElement[Any], error: ColumnElement[Any] | None) -> ColumnElement[Any]:
    """The row's ``attempt_history`` with the entry of the attempt this UPDATE ends.

    The entry reads the row as it was before the UPDATE (its attempt, worker and start), so
    it may go beside ``worker = NULL``. ``error`` is a JSONB object (``type``, ``message``,
    ``traceback``, cut to ``_error_text``'s bounds) or None. The array keeps the last
    :data:`~sa_jobqueue.models.ATTEMPT_HISTORY_LIMIT` entries: the statement adds one at a
    time, so dropping the first (``- 0``) once it is full holds the bound.
    """
    entry = func.jsonb_build_object(
        literal("attempt"),
        j.attempts,
        literal("at"),
        func.now(),
        literal("worker"),
        j.worker,
        # Seconds, to the millisecond; NULL if the attempt never recorded a start.
        literal("duration"),
        func.round(cast(func.extract("epoch", func.now() - j.started_at), Numeric), 3),
        literal("outcome"),
        outcome,
        literal("error"),
        null() if error is None else error,
    )
    # Anything but an array (NULL, or a value written by hand) starts a new one: were it kept,
    # jsonb_array_length would fail the statement, and with it every claim batch holding the
    # job and every attempt's outcome, again at each try.
    history = case(
        (func.jsonb_typeof(j.attempt_history) == "array", j.attempt_history),
        else_=literal_column("'[]'::jsonb", JSONB),
    )
    full = func.jsonb_array_length(history) >= ATTEMPT_HISTORY_LIMIT
    kept = case((full, history.op("-")(0)), else_=history)
    return kept.op("||")(func.jsonb_build_array(entry))
