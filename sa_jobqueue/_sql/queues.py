"""Per-queue flow settings: pausing and resuming a queue, and reading the settings back."""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import cache

from sqlalchemy import Select, Text, bindparam, func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.sql.dml import ReturningInsert, ReturningUpdate

from ..models import queues_table
from .stats import elapsed

q = queues_table.c


@cache
def pause() -> ReturningInsert[str]:
    """Pause ``:b_queue``: a row with ``paused_at = now()``, or the existing row's set to it.

    Returns the queue's name if this paused it, nothing if it was paused already: the first
    pause's ``paused_at`` is kept, so "paused for how long" means since it stopped.
    """
    stmt = insert(queues_table).values(queue=bindparam("b_queue", type_=Text), paused_at=func.now())
    return stmt.on_conflict_do_update(
        index_elements=[q.queue],
        set_={"paused_at": func.now()},
        where=q.paused_at.is_(None),
    ).returning(q.queue)


@cache
def resume() -> ReturningUpdate[str]:
    """Resume ``:b_queue`` if it is paused (the row stays, for the queue's other settings)."""
    return (
        update(queues_table)
        .where(q.queue == bindparam("b_queue", type_=Text), q.paused_at.is_not(None))
        .values(paused_at=None)
        .returning(q.queue)
    )


@cache
def paused_queues() -> Select[str, datetime]:
    """Every paused queue and when it was paused."""
    return select(q.queue, q.paused_at).where(q.paused_at.is_not(None)).order_by(q.queue)


@cache
def paused_for() -> Select[str, timedelta]:
    """Every paused queue and how long it has been paused, by the database's clock."""
    return select(q.queue, elapsed(q.paused_at)).where(q.paused_at.is_not(None)).order_by(q.queue)
