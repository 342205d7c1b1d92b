"""Figures about the queue for ``stats``, health checks and metrics: reads only, no locks."""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import cache
from typing import Any

from sqlalchemy import (
    ARRAY,
    ColumnElement,
    Interval,
    Select,
    Text,
    and_,
    any_,
    bindparam,
    func,
    literal,
    select,
    type_coerce,
)

from ..models import (
    DEAD,
    FINISHED_STATUSES,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    claimable,
    jobs_table,
    workers_table,
)
from .clock import seconds

j = jobs_table.c
w = workers_table.c


def elapsed(moment: ColumnElement[datetime]) -> ColumnElement[timedelta]:
    """``now() - moment``, typed as the interval it is."""
    return type_coerce(func.now() - moment, Interval)


@cache
def due_per_queue() -> Select[str, int, timedelta]:
    """Per queue: queued jobs that are due, and how long the oldest of them has waited."""
    # claimable() repeats the claim index's predicate, so the scan uses that index and never
    # reads finished history.
    return (
        select(j.queue, func.count(), elapsed(func.min(j.visible_at)))
        .where(claimable(), j.status == QUEUED, j.visible_at <= func.now())
        .group_by(j.queue)
        .order_by(j.queue)
    )


def _ready_now(filtered: bool) -> list[ColumnElement[bool]]:
    """The rows a claim could take now: in the claim index and due (queued jobs whose time
    has come, running jobs whose lease has expired); in ``:queues`` if ``filtered``."""
    # claimable() is the claim index's predicate word for word and visible_at one of its
    # columns: the count is an index-only scan of the backlog, never a read of finished history.
    where: list[ColumnElement[bool]] = [claimable(), j.visible_at <= func.now()]
    if filtered:
        where.append(j.queue == any_(bindparam("queues", type_=ARRAY(Text))))
    return where


@cache
def depth_per_queue(filtered: bool) -> Select[str, int]:
    """Per queue with any: jobs a claim could take now (see :func:`_ready_now`), as ``jobs``.

    Not held back by a pause, a cap, a rate or a dependency: those are read by the claim,
    and a queue held back still counts its waiting jobs."""
    return (
        select(j.queue, func.count().label("jobs"))
        .where(*_ready_now(filtered))
        .group_by(j.queue)
        .order_by(j.queue)
    )


@cache
def depth_total() -> Select[int]:
    """The jobs a claim could take now in ``:queues``, as one number ``jobs`` (the form an
    autoscaler's query takes: one row, one column)."""
    return select(func.count().label("jobs")).where(*_ready_now(True))


@cache
def live_per_queue() -> Select[str, int, int, int, timedelta | None]:
    """Per queue: queued, due and running jobs, and how long the oldest due job has waited.

    For metrics scraped every few seconds: it reads only the rows in the claim index (queued
    and running), never the finished history, so its cost follows the backlog, not the table.
    """
    queued = j.status == QUEUED
    due = and_(queued, j.visible_at <= func.now())
    return (
        select(
            j.queue,
            func.count().filter(queued),
            func.count().filter(due),
            func.count().filter(j.status == RUNNING),
            elapsed(func.min(j.visible_at).filter(due)),
        )
        .where(claimable())
        .group_by(j.queue)
        .order_by(j.queue)
    )


@cache
def finished_per_queue() -> Select[str, str, int]:
    """Per queue and finished status: jobs that finished in the last ``:window`` seconds."""
    return (
        select(j.queue, j.status, func.count())
        .where(
            j.status == any_(literal(list(FINISHED_STATUSES), ARRAY(Text))),
            j.finished_at >= func.now() - seconds("window"),
        )
        .group_by(j.queue, j.status)
        .order_by(j.queue, j.status)
    )


@cache
def run_times() -> Select[str, int, timedelta, timedelta]:
    """Per task: jobs finished in the last ``:window`` seconds, and their p50 and p99 run time.

    The run time is ``finished_at - started_at`` of the job's last attempt (started at its
    claim, so time spent in the worker's buffer counts too). Succeeded and dead jobs only:
    a job cancelled while queued never ran.
    """
    run = j.finished_at - j.started_at
    return (
        select(
            j.task,
            func.count(),
            func.percentile_cont(0.5).within_group(run).cast(Interval),
            func.percentile_cont(0.99).within_group(run).cast(Interval),
        )
        .where(
            j.status == any_(literal([SUCCEEDED, DEAD], ARRAY(Text))),
            j.started_at.is_not(None),
            j.finished_at >= func.now() - seconds("window"),
        )
        .group_by(j.task)
        .order_by(j.task)
    )


@cache
def live_workers() -> Select[Any]:
    """Workers whose heartbeat was seen in the last ``:stale_after`` seconds."""
    return (
        select(w.name, w.host, w.pid, w.queues, w.concurrency, w.started_at, w.last_seen_at)
        .where(w.last_seen_at >= func.now() - seconds("stale_after"))
        .order_by(w.name)
    )
