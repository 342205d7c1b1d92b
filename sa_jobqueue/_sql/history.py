"""The long history: finished jobs per queue and hour, folded in from the jobs table.

Nothing here runs on the completion path. The worker's upkeep folds the jobs that finished
between the mark (``folded_to``) and a horizon a little behind ``now()`` into hourly counts,
and moves the mark to the horizon, in one transaction under the prune lock (so folds and
prunes never overlap); pruning counts the jobs it deletes that the fold has not reached yet.
Each finish is so counted once: by the fold if its job is still there, by the prune if not.

The horizon stays behind every open transaction of the database (``pg_stat_activity``): a
finish is stamped no earlier than its transaction began, so one that has not committed yet
lies past the horizon and is folded by a later round. What is not promised: a transaction
open longer than :data:`MAX_LAG`, or one of another role that this role may not see in
``pg_stat_activity`` (without ``pg_read_all_stats``) and open longer than :data:`LAG`, can
commit a finish behind the mark, which is then never counted.
"""

from __future__ import annotations

from datetime import datetime
from functools import cache
from typing import Any, Final

from sqlalchemy import (
    ARRAY,
    ColumnElement,
    DateTime,
    Delete,
    Insert,
    Integer,
    Select,
    Text,
    Update,
    any_,
    bindparam,
    cast,
    column,
    delete,
    extract,
    func,
    literal,
    or_,
    select,
    table,
    update,
)
from sqlalchemy.dialects.postgresql import insert

from ..models import (
    CANCELLED,
    DEAD,
    SUCCEEDED,
    dead,
    history_mark_table,
    history_table,
    jobs_table,
    prunable,
)
from .clock import seconds

#: Seconds the fold's horizon stays behind ``now()`` at least: a finish commits a moment
#: after its stamp (``statement_timestamp()``), a few milliseconds usually.
LAG: Final = 60.0
#: Seconds the horizon waits for an open transaction at most: one open longer than an hour
#: (an idle session left in a transaction) no longer holds the history back.
MAX_LAG: Final = 3_600.0
#: Seconds of finishes one fold reads at most: a worker that comes back after a week catches
#: up a quarter of an hour at a time, each its own transaction (at 1,000 jobs/s, 900,000 rows
#: of the prune index: a few seconds; in a steady state a round reads the last minute's).
SPAN: Final = 900.0

j = jobs_table.c
h = history_table.c
m = history_mark_table.c

_TIMESTAMP = DateTime(timezone=True)


def hour_of(moment: ColumnElement[datetime]) -> ColumnElement[datetime]:
    """The UTC hour ``moment`` falls in: the same bucket whatever a session's time zone (a
    zone half an hour off UTC would otherwise cut hours of its own)."""
    return func.timezone("UTC", func.date_trunc("hour", func.timezone("UTC", moment)))


def _counts(status: ColumnElement[str]) -> list[ColumnElement[int]]:
    return [
        func.count().filter(status == SUCCEEDED).label("succeeded"),
        func.count().filter(status == DEAD).label("dead"),
        func.count().filter(status == CANCELLED).label("cancelled"),
    ]


def _added(counted: Select[Any]) -> Insert:
    """``counted`` (queue, hour and the three counts) added to the history's rows."""
    statement = insert(history_table).from_select(
        ["queue", "hour", "succeeded", "dead", "cancelled"], counted
    )
    return statement.on_conflict_do_update(
        index_elements=[h.queue, h.hour],
        set_={
            "succeeded": h.succeeded + statement.excluded.succeeded,
            "dead": h.dead + statement.excluded.dead,
            "cancelled": h.cancelled + statement.excluded.cancelled,
        },
    )


@cache
def fold_window() -> Select[datetime, datetime, bool]:
    """Lock the mark; return it (``folded_to``), the horizon of this fold, and whether the
    horizon is the furthest one (no more to fold after this round).

    The horizon: ``LAG`` seconds ago, or when the oldest open transaction of the database
    began if that is earlier (but no more than ``MAX_LAG`` ago); then at most ``SPAN`` past
    the mark.
    """
    activity = table(
        "pg_stat_activity",
        column("datname"),
        column("pid"),
        column("xact_start", _TIMESTAMP),
        column("backend_type"),
    )
    oldest = (
        select(func.min(activity.c.xact_start))
        .where(
            activity.c.datname == func.current_database(),
            activity.c.pid != func.pg_backend_pid(),
            activity.c.backend_type == literal("client backend"),
        )
        .scalar_subquery()
    )
    furthest = func.greatest(
        func.now() - seconds("max_lag"),
        func.least(func.now() - seconds("lag"), func.coalesce(oldest, func.now())),
    )
    horizon = func.least(m.folded_to + seconds("span"), furthest)
    return select(
        m.folded_to.label("folded_to"),
        horizon.label("horizon"),
        (horizon >= furthest).label("caught_up"),
    ).with_for_update()


@cache
def fold() -> Insert:
    """Add the jobs that finished in ``[:since, :until)`` to the history, per queue and hour.

    Succeeded and cancelled jobs from the prune index, dead ones from the dead index, each a
    range of ``finished_at``: the statement reads the window's finishes and no other row.
    """
    since = bindparam("since", type_=_TIMESTAMP)
    until = bindparam("until", type_=_TIMESTAMP)
    hour = hour_of(j.finished_at)
    counted = (
        select(j.queue, hour.label("hour"), *_counts(j.status))
        .where(or_(prunable(), dead()), j.finished_at >= since, j.finished_at < until)
        .group_by(j.queue, hour)
    )
    return _added(counted)


@cache
def advance() -> Update:
    """Move the mark from ``:since`` to ``:until``: compare-and-set, one row or none."""
    since = bindparam("since", type_=_TIMESTAMP)
    return (
        update(history_mark_table)
        .where(m.folded_to == since)
        .values(folded_to=bindparam("until", type_=_TIMESTAMP))
    )


def count_deleted(deleted: Any) -> Insert:
    """Add the rows of ``deleted`` (a DELETE ... RETURNING queue, status, finished_at, as a
    CTE) that finished at or after the mark, which no fold has counted, to the history."""
    hour = hour_of(deleted.c.finished_at)
    mark = select(m.folded_to).scalar_subquery()
    counted = (
        select(deleted.c.queue, hour.label("hour"), *_counts(deleted.c.status))
        .where(deleted.c.finished_at >= mark)
        .group_by(deleted.c.queue, hour)
    )
    return _added(counted)


@cache
def prune_history() -> Delete:
    """Delete up to ``:limit`` hours of the history older than ``:kept`` seconds."""
    doomed = (
        select(h.queue, h.hour)
        .where(h.hour < func.now() - seconds("kept"))
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
        .cte("doomed")
        .prefix_with("MATERIALIZED")
    )
    return delete(history_table).where(h.queue == doomed.c.queue, h.hour == doomed.c.hour)


def _names() -> ColumnElement[bool]:
    return h.queue == any_(bindparam("names", type_=ARRAY(Text)))


@cache
def hours_on_page() -> Select[str, int, int, int, int]:
    """The hours of the queues ``:names`` from ``:span`` seconds before this hour's start: each
    queue, how many hours before this one (0: this hour, folded so far), and its counts."""
    this_hour = hour_of(func.now())
    ago = cast(extract("epoch", this_hour - h.hour) / literal(3600, Integer), Integer)
    return (
        select(h.queue, ago.label("hours_ago"), h.succeeded, h.dead, h.cancelled)
        .where(_names(), h.hour >= this_hour - seconds("span"))
        .order_by(h.queue, h.hour)
    )


@cache
def totals_on_page() -> Select[Any]:
    """Per queue of ``:names``: its finishes in this hour and the ``:day`` seconds before it,
    and in this hour and the ``:week`` seconds before it, per finished status."""
    this_hour = hour_of(func.now())
    in_day = h.hour >= this_hour - seconds("day")
    return (
        select(
            h.queue,
            *(func.sum(h[s]).filter(in_day).label(f"day_{s}") for s in _STATUSES),
            *(func.sum(h[s]).label(f"week_{s}") for s in _STATUSES),
        )
        .where(_names(), h.hour >= this_hour - seconds("week"))
        .group_by(h.queue)
    )


_STATUSES: Final = (SUCCEEDED, DEAD, CANCELLED)


@cache
def folded_to() -> Select[datetime]:
    """How far the history is folded in (no row: the table's row was deleted by hand)."""
    return select(m.folded_to)
