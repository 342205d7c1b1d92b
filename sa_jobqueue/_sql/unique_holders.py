"""The job holding a unique key: finding it, and updating it in place (replace, debounce).

Run after an insert of :mod:`.enqueue` skipped a row because a job of the task holds its key:
:func:`update_held` gives a queued holder the enqueue's payload, priority and due time (the
replace and debounce modes), and :func:`find_unique` finds the holder that was left as it was.
"""

from __future__ import annotations

from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import (
    ARRAY,
    ColumnElement,
    Integer,
    Select,
    Text,
    Update,
    any_,
    bindparam,
    case,
    cast,
    column,
    func,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB

from ..models import (
    QUEUED,
    jobs_table,
    unique_live,
)
from .enqueue import CHANNEL, due_at, unique_window

j = jobs_table.c


@cache
def find_unique(period: bool = False) -> Select[str, int]:
    """The live jobs of ``:task`` that hold one of ``:unique_keys``: ``(unique_key, id)``.

    Run after an insert of :func:`insert_job` or :func:`insert_jobs` skipped a row, as a
    statement of its own: under READ COMMITTED it then sees a conflicting row that a
    concurrent transaction committed while the insert waited for it. It may also find nothing,
    if that job finished in between: the caller inserts again.

    With ``period``, a job of the current window of ``:unique_period`` seconds holds its key
    too, finished or not. A key may then have two rows (a dead job of an earlier window,
    requeued, beside a finished one of this window): they come back in key order, the live one
    first, and the caller takes the first row of each key.
    """
    stmt = select(j.unique_key, j.id).where(
        j.task == bindparam("task", type_=Text),
        j.unique_key == any_(bindparam("unique_keys", type_=ARRAY(Text))),
    )
    if not period:
        return stmt.where(unique_live())
    return (
        stmt.where(or_(unique_live(), j.unique_window == unique_window("unique_period")))
        # A live job first (finished_at is NULL exactly while a job is live), then the newest.
        .order_by(j.unique_key, j.finished_at.is_not(None), j.id.desc())
    )


def held_due(mode: str, schedule: str) -> ColumnElement[datetime]:
    """A queued holder's new due time: the enqueue's (replace), or the later of the two."""
    due = due_at(schedule)
    return due if mode == "replace" else func.greatest(j.visible_at, due)


@cache
def update_held(mode: str, schedule: str, traced: bool = False, many: bool = False) -> Update:
    """Give the queued job of ``:b_task`` holding ``:b_unique_key`` the enqueue's
    ``:b_payload``, ``:b_priority`` and due time (see :func:`held_due`); if it was queued,
    ``(id, unique_key, queue)`` comes back.

    The guard is ``status = 'queued'`` in this one statement, never a read before it: a
    running job is never changed, whatever its worker does next. A claim that has locked the
    row makes this statement wait for it; under READ COMMITTED the row is then read again, is
    running, and is left alone (no row comes back). A row this statement updated stays locked
    until the caller's transaction ends, and the claim (``SKIP LOCKED``) passes it over until
    then.

    The job's queue is woken (a NOTIFY in the RETURNING, delivered at commit) when the job is
    due now once updated: a replace may have moved it earlier. A job due later is found by the
    workers' poll, as one enqueued for later is. ``queue`` comes back only for a job due now;
    the caller records it as woken. PostgreSQL folds repeated notifications of one
    transaction into one, so the holder's queue is notified without asking whether this
    transaction already did.

    With ``traced`` the job takes ``:b_trace_context`` too: its run is then linked to the
    enqueue whose payload it runs. With ``many``, a batch: ``:payloads`` and ``:unique_keys``
    run parallel, the keys all different. The parameters take the prefix ``b_`` (``run_at``
    and ``delay`` excepted), as in :func:`insert_jobs`: an UPDATE may not reuse a column's
    name for a bind parameter either.
    """
    payload: ColumnElement[Any]
    held: list[ColumnElement[bool]] = [
        j.task == bindparam("b_task", type_=Text),
        unique_live(),  # the unique index's predicate: the rows are found through it
        j.status == QUEUED,
    ]
    stmt = update(jobs_table)
    if many:
        given = (
            func.unnest(
                bindparam("payloads", type_=ARRAY(Text)),
                bindparam("unique_keys", type_=ARRAY(Text)),
            )
            # Not named like the table's columns: the index predicate names them unqualified.
            .table_valued(column("new_payload", Text), column("held_key", Text))
            .render_derived(name="p")
        )
        # The rows are locked first, in id order: two batches that share keys then wait for
        # each other in one order and cannot deadlock, which an UPDATE joining the keys in
        # whatever order its plan reads them could. The locking read applies the same guard
        # (a row claimed meanwhile is read again and dropped); the UPDATE repeats it for rows
        # it already holds locked.
        locked = (
            select(j.id, given.c.new_payload)
            .select_from(jobs_table.join(given, j.unique_key == given.c.held_key))
            .where(*held)
            .order_by(j.id)
            .with_for_update(of=jobs_table)
            .cte("held")
            .prefix_with("MATERIALIZED")
        )
        stmt = stmt.where(j.id == locked.c.id, j.status == QUEUED)
        payload = locked.c.new_payload
    else:
        stmt = stmt.where(j.unique_key == bindparam("b_unique_key", type_=Text), *held)
        payload = bindparam("b_payload", type_=Text)
    values: dict[str, Any] = {
        "payload": cast(payload, JSONB),
        "priority": bindparam("b_priority", type_=Integer),
        "visible_at": held_due(mode, schedule),
    }
    if traced:
        values["trace_context"] = cast(bindparam("b_trace_context", type_=Text), JSONB)
    due_now = j.visible_at <= func.now()
    return stmt.values(**values).returning(
        j.id,
        j.unique_key,
        case((due_now, j.queue)),
        case((due_now, func.pg_notify(CHANNEL, j.queue))),
    )
