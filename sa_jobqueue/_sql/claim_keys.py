"""The limited claim's limits per key: a cap and a rate on the jobs of a task that share a key.

A queue with ``key_field`` set limits, per (task, value of that top-level payload field), how
many jobs run at once (``key_concurrency``) and how many start per window (``key_rate_limit``
per ``key_rate_period``). The keyed variant of ``claim_limits.claim_limited`` picks its jobs
with :func:`pick_keyed` and counts their starts with :func:`note_key_starts`; each part below
is one CTE or subquery of that statement, named as in its SQL.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from sqlalchemy import (
    CTE,
    ColumnElement,
    Integer,
    Subquery,
    Text,
    and_,
    bindparam,
    case,
    cast,
    column,
    exists,
    func,
    null,
    or_,
    select,
)
from sqlalchemy.dialects.postgresql import JSONB, Insert, insert

from ..models import RUNNING, jobs_table, key_starts_table, queues_table
from .claiming import due_in_queue, in_claim_order, picked_columns, rate_window

#: How many of a key-capped queue's due jobs one claim looks at, in claim order, for jobs whose
#: key has room: jobs further back wait until the ones in front start (or their keys free up).
KEY_SCAN: Final = 1000
#: The SQL function (revision sajq_0010) that reads the starts per key in the current window of
#: a queue's rate per key, with a snapshot taken after the queue's row was locked.
KEY_STARTS_FUNCTION: Final = "sa_jobqueue_key_starts"

j = jobs_table.c
q = queues_table.c


@dataclass(frozen=True)
class KeyRate:
    """The queue's rate per key, read once per statement: its count, its period and the start
    of the window ``now()`` falls in (each NULL without one), as this statement's snapshot has
    them (a rate set while the claim waited for the lock applies from the next claim)."""

    limit: ColumnElement[int]
    period: ColumnElement[timedelta]
    window: ColumnElement[datetime]

    @classmethod
    def read(cls) -> KeyRate:
        """The CTE ``key_rate`` (the queue's row, unlocked), as three scalar subqueries."""
        row = (
            select(
                q.key_rate_limit.label("limit"),
                q.key_rate_period.label("period"),
                rate_window(q.key_rate_period).label("window"),
            )
            .where(q.queue == bindparam("from_queue", type_=Text))
            .cte("key_rate")
        )
        c = row.c
        return cls(
            select(c.limit).scalar_subquery(),
            select(c.period).scalar_subquery(),
            select(c.window).scalar_subquery(),
        )


def _head(key: ColumnElement[str], skip: ColumnElement[bool] | None) -> CTE:
    """The CTE ``head``: the first :data:`KEY_SCAN` due jobs in claim order, with their keys.

    Bounded, so one claim's work does not grow with the backlog: a queue whose first thousand
    jobs all wait for busy keys starts none of the jobs behind them until those move.
    MATERIALIZED, so the head is scanned once although ``ranked``, ``unkeyed`` and the
    key-starts call all read it.
    """
    return (
        select(*picked_columns(), j.task, key.label("k"))
        .where(*due_in_queue(skip))
        .order_by(*in_claim_order(j))
        .limit(KEY_SCAN)
        .cte("head")
        .prefix_with("MATERIALIZED")
    )


def _ranked(head: CTE) -> Subquery:
    """The subquery ``ranked``: each keyed job of the head with its rank among the head's jobs
    of its (task, key), in claim order. A job fits if its rank plus what its key already uses
    is within the key's limit: so one key's jobs start in claim order, never a later one ahead
    of an earlier one that did not fit."""
    rank = func.row_number().over(
        partition_by=(head.c.task, head.c.k),
        order_by=in_claim_order(head.c),
    )
    return select(head, rank.label("rank")).where(head.c.k.is_not(None)).subquery("ranked")


def _live_per_key(key: ColumnElement[str], live_ids: ColumnElement[list[int]]) -> Subquery:
    """The subquery ``per_key``: how many of the queue's live holders each (task, key) has, for
    the cap per key. Read from the holders the lock function returned (a primary-key probe
    each), not by scanning the queue's running jobs."""
    live = (
        select(j.task, key.label("k"))
        # Cast: ``= ANY ((SELECT ...))`` would be read as ANY over the subquery's rows.
        .where(j.id == func.any(live_ids))
        .subquery("live")
    )
    return (
        select(live.c.task, live.c.k, func.count().label("n"))
        .where(live.c.k.is_not(None))
        .group_by(live.c.task, live.c.k)
        .subquery("per_key")
    )


def _starts_per_key(head: CTE, rate: KeyRate) -> Subquery:
    """The subquery ``used``: the starts of each (task, key) of the head in the current window
    of the rate per key. Read by :data:`KEY_STARTS_FUNCTION`, whose snapshot follows the lock
    on the queue's row: in this statement's own snapshot, taken before the lock wait, the
    starts the previous claim committed meanwhile would be missing and the rate overrun."""
    used = getattr(func, KEY_STARTS_FUNCTION)(
        bindparam("from_queue", type_=Text),
        rate.window,
        select(func.array_agg(head.c.task)).scalar_subquery(),
        select(func.array_agg(head.c.k)).scalar_subquery(),
    ).table_valued(column("task", Text), column("key", Text), column("starts", Integer))
    return select(used).where(rate.limit.is_not(None)).subquery("used")


def _checked(state: CTE, ranked: Subquery, per_key: Subquery, used: Subquery, rate: KeyRate) -> CTE:
    """The CTE ``checked``: per keyed job of the head, whether it ``fits`` under both limits of
    its key, and whether it fits under the rate alone (``rate_fits``: a job held back by the
    rate tells the worker when to claim again; one held back by the cap does not)."""
    joined = ranked.outerjoin(
        per_key, and_(per_key.c.task == ranked.c.task, per_key.c.k == ranked.c.k)
    ).outerjoin(used, and_(used.c.task == ranked.c.task, used.c.key == ranked.c.k))
    key_cap = select(state.c.key_cap).scalar_subquery()
    cap_room = or_(key_cap.is_(None), ranked.c.rank + func.coalesce(per_key.c.n, 0) <= key_cap)
    rate_room = or_(
        rate.limit.is_(None), ranked.c.rank + func.coalesce(used.c.starts, 0) <= rate.limit
    )
    return (
        select(ranked.c.id, and_(cap_room, rate_room).label("fits"), rate_room.label("rate_fits"))
        .select_from(joined)
        .cte("checked")
    )


def pick_keyed(
    state: CTE,
    key: ColumnElement[str],
    room: ColumnElement[int],
    live_ids: ColumnElement[list[int]],
    skip: ColumnElement[bool] | None,
    rate: KeyRate,
) -> tuple[CTE, ColumnElement[Any]]:
    """``claiming.pick_due`` for a queue with limits per key: only jobs whose key has room under
    its cap per key and its rate per key (and jobs without a key); and the seconds until the
    next window of the rate per key when a due job was held back by it and the claim had room
    (else NULL)."""
    head = _head(key, skip)
    ranked = _ranked(head)
    checked = _checked(
        state, ranked, _live_per_key(key, live_ids), _starts_per_key(head, rate), rate
    )
    unkeyed = select(head.c.id).where(head.c.k.is_(None))
    eligible = select(checked.c.id).where(checked.c.fits).union_all(unkeyed)
    # Only a claim with room is held back by a key's rate: with none (a pause, a cap whose
    # slots are held, a used-up rate of the queue) the next window of a key would start nothing.
    rate_held = and_(room > 0, exists().where(~checked.c.rate_fits))
    key_wait = case(
        (rate_held, func.extract("epoch", rate.window + rate.period - func.clock_timestamp())),
        else_=null(),
    )
    # The eligible jobs are locked here, in claim order, as the plain claim locks its rows: a
    # job another claim took since the head was read is skipped, not waited for.
    picked = (
        select(*picked_columns())
        .where(j.id.in_(eligible), *due_in_queue(skip))
        .order_by(*in_claim_order(j))
        .limit(room)
        .with_for_update(skip_locked=True)
        .cte("picked")
        .prefix_with("MATERIALIZED")
    )
    return picked, key_wait


def note_key_starts(claimed: CTE, key_name: ColumnElement[str], rate: KeyRate) -> Insert:
    """Count the jobs a claim started against their keys' current window of the rate per key:
    an upsert per (task, key). A key whose row is in a later window already starts nothing in
    this claim (see :data:`KEY_STARTS_FUNCTION`); were it to, the row would keep that window,
    with these starts added, never going back to an earlier one."""
    key_rate, window = rate.limit, rate.window
    key = cast(claimed.c.payload, JSONB).op("->>")(key_name)
    counted = (
        select(
            bindparam("from_queue", type_=Text),
            claimed.c.task,
            key,
            window,
            cast(func.count(), Integer),
        )
        .where(claimed.c.status == RUNNING, key.is_not(None), key_rate.is_not(None))
        .group_by(claimed.c.task, key)
    )
    k = key_starts_table.c
    stmt = insert(key_starts_table).from_select(
        [k.queue, k.task, k.key, k.window_start, k.starts], counted
    )
    new = stmt.excluded
    return stmt.on_conflict_do_update(
        index_elements=[k.queue, k.task, k.key],
        set_={
            "window_start": func.greatest(k.window_start, new.window_start),
            "starts": case(
                (k.window_start >= new.window_start, k.starts + new.starts), else_=new.starts
            ),
        },
    )
