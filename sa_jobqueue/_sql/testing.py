"""What :mod:`sa_jobqueue.testing`'s ``drain`` reads and writes around its worker bursts."""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import (
    ARRAY,
    Select,
    Text,
    Update,
    any_,
    bindparam,
    exists,
    func,
    select,
    update,
)

from ..models import QUEUED, claimable, jobs_table

j = jobs_table.c


@cache
def queues_holding_jobs() -> Select[str]:
    """The queues with queued or running jobs."""
    return select(j.queue).where(claimable()).distinct()


@cache
def make_due(kind: str) -> Update:
    """Queued jobs of ``:queues`` that are not due yet, made due now.

    ``kind`` ``"scheduled"``: jobs enqueued for later, which have not run yet (no attempt);
    ``"retries"``: jobs waiting out the backoff after a failed attempt.
    """
    waiting = j.attempts > 0 if kind == "retries" else j.attempts == 0
    return (
        update(jobs_table)
        .where(
            claimable(),  # the claim index's predicate, so the planner can use that index
            j.status == QUEUED,
            j.queue == any_(bindparam("queues", type_=ARRAY(Text))),
            j.visible_at > func.now(),
            waiting,
        )
        .values(visible_at=func.now())
    )


@cache
def any_due() -> Select[tuple[bool]]:
    """Whether any job of ``:queues`` is due: what the claim would take."""
    return select(
        exists().where(
            claimable(),
            j.queue == any_(bindparam("queues", type_=ARRAY(Text))),
            j.visible_at <= func.now(),
        )
    )


@cache
def claimed_since(columns: tuple[str, ...]) -> Select[Any]:
    """``columns`` of the jobs of ``:queues`` claimed at or after ``:started``, in id order."""
    # Every claim stamps started_at with the database's now(), later than ``started``; no
    # outcome clears it. So these are exactly the jobs claimed since the drain began.
    started = bindparam("started", type_=j.started_at.type)
    return (
        select(*(j[name] for name in columns))
        .where(j.started_at >= started, j.queue == any_(bindparam("queues", type_=ARRAY(Text))))
        .order_by(j.id)
    )
