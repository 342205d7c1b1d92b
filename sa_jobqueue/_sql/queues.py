"""Per-queue flow settings: pausing and resuming a queue, and reading the settings back."""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import cache
from typing import Any

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    Insert,
    Integer,
    Interval,
    Select,
    Text,
    any_,
    bindparam,
    case,
    exists,
    func,
    null,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.sql.dml import ReturningInsert, ReturningUpdate

from ..models import DEAD, RUNNING, claimable, jobs_table, queues_table, workers_table
from .claiming import rate_window
from .stats import elapsed

q = queues_table.c
j = jobs_table.c


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
def known() -> Select[tuple[bool]]:
    """Whether anything knows the queue ``:b_queue``: a queued or running job, a dead one, a
    settings row (a pause, a limit), or a registered worker serving it.

    Read through the claim index, the dead-job index, the settings' key and the small worker
    registry, never the table's history: a queue whose only jobs have succeeded or been
    cancelled (or wait for dependencies) counts as unknown.
    """
    name = bindparam("b_queue", type_=Text)
    return select(
        or_(
            exists().where(j.queue == name, claimable()),
            exists().where(j.queue == name, j.status == DEAD),
            exists().where(q.queue == name),
            exists().where(name == any_(workers_table.c.queues)),
        )
    )


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


@cache
def limited() -> Select[tuple[str, bool]]:
    """Every queue with a limit (a cap, a rate, a cap or rate per key), and whether it has a
    limit per key."""
    return select(q.queue, q.key_field.is_not(None)).where(_limited())


def _limited() -> ColumnElement[bool]:
    # A limit per key (a cap or a rate) sets the key field.
    return or_(q.concurrency.is_not(None), q.rate_limit.is_not(None), q.key_field.is_not(None))


@cache
def settings() -> Select[Any]:
    """``:b_queue``'s limits, its row locked for the change that follows (no row: none)."""
    return (
        select(
            q.concurrency,
            q.rate_limit,
            q.rate_period,
            q.key_concurrency,
            q.key_field,
            q.key_rate_limit,
            q.key_rate_period,
        )
        .where(q.queue == bindparam("b_queue", type_=Text))
        .with_for_update()
    )


def _set_caps(
    new: dict[str, ColumnElement[Any]], changed: dict[str, ColumnElement[Any]] | None = None
) -> Insert:
    """Upsert ``:b_queue``'s row: made with ``new`` (column: value), or updated with
    ``changed`` (default: ``new``).

    A queue that had no cap of either kind has no record of which jobs hold its slots: the
    record is cleared, and the queue's limited claims count its running jobs afresh
    (``claiming``). A queue that had one keeps it: its claims kept it up to date.
    """
    stmt = insert(queues_table).values(queue=bindparam("b_queue", type_=Text), **new)
    had_cap = or_(q.concurrency.is_not(None), q.key_concurrency.is_not(None))
    return stmt.on_conflict_do_update(
        index_elements=[q.queue],
        set_={
            **(new if changed is None else changed),
            "holders": case((had_cap, q.holders), else_=null()),
            "recount_until": case((had_cap, q.recount_until), else_=null()),
        },
    )


def _key_field(limit: BindParameter[Any]) -> ColumnElement[str | None]:
    """``:b_key_field`` for a new row: NULL unless ``limit`` (a limit per key) is set. An
    existing row takes ``:b_key_field`` as it is (kept for its other limit per key), but a
    new row has no other, and its checks are made before the conflict is found."""
    return case((limit.is_(None), null()), else_=bindparam("b_key_field", type_=Text))


@cache
def set_concurrency() -> Insert:
    """Set ``:b_queue``'s cap to ``:b_concurrency`` (NULL: no cap); see :func:`_set_caps`."""
    return _set_caps({"concurrency": bindparam("b_concurrency", type_=Integer)})


@cache
def set_key_concurrency() -> Insert:
    """Set ``:b_queue``'s cap per key to ``:b_key_concurrency`` jobs with the same value of the
    payload's ``:b_key_field`` (the field stays while the queue has a rate per key); see
    :func:`_set_caps`."""
    cap = bindparam("b_key_concurrency", type_=Integer)
    field = bindparam("b_key_field", type_=Text)
    return _set_caps(
        {"key_concurrency": cap, "key_field": _key_field(cap)},
        {"key_concurrency": cap, "key_field": field},
    )


@cache
def set_key_rate() -> Insert:
    """Set ``:b_queue``'s rate per key to ``:b_key_rate_limit`` starts per
    ``:b_key_rate_period`` for each value of the payload's ``:b_key_field`` (both NULL: none;
    the field stays while the queue has a cap per key), making its row if need be."""
    count = bindparam("b_key_rate_limit", type_=Integer)
    period = bindparam("b_key_rate_period", type_=Interval)
    stmt = insert(queues_table).values(
        queue=bindparam("b_queue", type_=Text),
        key_rate_limit=count,
        key_rate_period=period,
        key_field=_key_field(count),
    )
    return stmt.on_conflict_do_update(
        index_elements=[q.queue],
        set_={
            "key_rate_limit": count,
            "key_rate_period": period,
            "key_field": bindparam("b_key_field", type_=Text),
        },
    )


@cache
def set_rate() -> Insert:
    """Set ``:b_queue``'s rate limit to ``:b_rate_limit`` per ``:b_rate_period`` (both NULL:
    none), making its row if need be. The current window's count is kept."""
    stmt = insert(queues_table).values(
        queue=bindparam("b_queue", type_=Text),
        rate_limit=bindparam("b_rate_limit", type_=Integer),
        rate_period=bindparam("b_rate_period", type_=Interval),
    )
    return stmt.on_conflict_do_update(
        index_elements=[q.queue],
        set_={"rate_limit": stmt.excluded.rate_limit, "rate_period": stmt.excluded.rate_period},
    )


@cache
def all_limits() -> Select[Any]:
    """Every queue with a limit: its cap, its rate, and the starts its current window used."""
    window = rate_window()
    used = case((q.rate_window == window, q.rate_count), else_=0)
    return (
        select(
            q.queue,
            q.concurrency,
            q.rate_limit,
            q.rate_period,
            used,
            q.key_concurrency,
            q.key_field,
            q.key_rate_limit,
            q.key_rate_period,
        )
        .where(_limited())
        .order_by(q.queue)
    )


@cache
def live_leases() -> Select[Any]:
    """Per queue: running jobs with a live lease (those holding slots), from the claim index."""
    return (
        select(j.queue, func.count())
        .where(claimable(), j.status == RUNNING, j.visible_at > func.now())
        .group_by(j.queue)
    )
