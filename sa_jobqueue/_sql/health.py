"""What the health checks read: the queue's tables and PostgreSQL's statistics views.

``pg_stat_user_tables`` (dead row versions, last vacuum), ``pg_stat_activity`` and
``pg_prepared_xacts`` (what holds the xmin horizon back) and ``pg_replication_slots``. A role
sees other roles' sessions only as a superuser or a member of ``pg_read_all_stats``.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import (
    BigInteger,
    CompoundSelect,
    Integer,
    Select,
    Text,
    bindparam,
    column,
    func,
    null,
    or_,
    select,
    table,
    union_all,
)

from ..models import DEAD, QUEUED, RUNNING, claimable, jobs_table, queues_table, workers_table
from .clock import seconds
from .queues import paused_queues
from .stats import elapsed

j = jobs_table.c
w = workers_table.c


@cache
def worker_freshness() -> Select[int, int]:
    """Worker rows in total, and those seen in the last ``:stale_after`` seconds."""
    fresh = w.last_seen_at >= func.now() - seconds("stale_after")
    return select(func.count(), func.count().filter(fresh)).select_from(workers_table)


@cache
def due_and_stale() -> CompoundSelect[Any]:
    """The due jobs and expired leases the checks judge, in one read of the claim index's due
    entries, with only the queues that a check names sent back.

    Rows ``(queue, due, waited, paused, stale, stale_for)``. First one per queue with due jobs
    that is paused, or whose oldest due job has waited over ``:max_wait`` seconds: how many
    are due, how long the oldest has waited, whether the queue is paused (``stale`` NULL).
    Last one with ``queue`` NULL: the due jobs of every other queue (``due``), and the running
    jobs whose lease ran out more than ``:grace`` seconds ago (``stale``) with the worst case
    (``stale_for``), in every queue.
    """
    # A queue per customer means thousands of queues with due jobs: sending a row for each,
    # to be judged in Python, cost more than the read itself (10,000 rows, 20 ms). Expired
    # leases are among the same entries (visible_at, a lease's end, in the past), so they are
    # counted in the same pass rather than by a second read of the index.
    queued = j.status == QUEUED
    stale = (j.status == RUNNING) & (j.visible_at < func.now() - seconds("grace"))
    per_queue = (
        select(
            j.queue,
            func.count().filter(queued).label("due"),
            func.min(j.visible_at).filter(queued).label("oldest"),
            func.count().filter(stale).label("stale"),
            func.min(j.visible_at).filter(stale).label("stale_since"),
        )
        .where(claimable(), j.visible_at <= func.now())
        .group_by(j.queue)
        .cte("per_queue")
    )
    paused = paused_queues().with_only_columns(queues_table.c.queue).order_by(None)
    marked = select(
        per_queue,
        per_queue.c.queue.in_(paused).label("paused"),
        (elapsed(per_queue.c.oldest) > seconds("max_wait")).label("late"),
    ).cte("marked")
    named = or_(marked.c.paused, marked.c.late)
    listed = select(
        marked.c.queue,
        marked.c.due,
        elapsed(marked.c.oldest),
        marked.c.paused,
        null().label("stale"),
        null().label("stale_for"),
    ).where(marked.c.due > 0, named)
    rest = select(
        null().label("queue"),
        func.coalesce(func.sum(marked.c.due).filter(~named), 0),
        null().label("waited"),
        null().label("paused"),
        func.coalesce(func.sum(marked.c.stale), 0),
        elapsed(func.min(marked.c.stale_since)),
    )
    return union_all(listed, rest)


@cache
def recent_dead() -> Select[int]:
    """Jobs that went to ``dead`` in the last ``:window`` seconds."""
    return select(func.count()).where(
        j.status == DEAD, j.finished_at >= func.now() - seconds("window")
    )


_stat_tables = table(
    "pg_stat_user_tables",
    column("relid"),
    column("n_live_tup", BigInteger),
    column("n_dead_tup", BigInteger),
    column("last_vacuum"),
    column("last_autovacuum"),
    schema="pg_catalog",
)
_activity = table(
    "pg_stat_activity",
    column("pid", Integer),
    column("datname", Text),
    column("usename", Text),
    column("application_name", Text),
    column("state", Text),
    column("xact_start"),
    column("backend_xid"),
    column("backend_xmin"),
    schema="pg_catalog",
)
_prepared = table(
    "pg_prepared_xacts",
    column("gid", Text),
    column("database", Text),
    column("prepared"),
    column("transaction"),
    schema="pg_catalog",
)
_slots = table(
    "pg_replication_slots",
    column("slot_name", Text),
    column("slot_type", Text),
    column("active"),
    column("xmin"),
    column("catalog_xmin"),
    schema="pg_catalog",
)


@cache
def table_vacuum() -> Select[Any]:
    """Live and dead row versions of ``:table`` and how long ago it was (auto)vacuumed."""
    return select(
        _stat_tables.c.n_live_tup,
        _stat_tables.c.n_dead_tup,
        func.now() - _stat_tables.c.last_vacuum,
        func.now() - _stat_tables.c.last_autovacuum,
    ).where(_stat_tables.c.relid == func.to_regclass(bindparam("table", type_=Text)))


@cache
def oldest_transaction() -> Select[Any]:
    """The other session whose transaction holds back the xmin horizon the longest.

    A session pins the horizon with its transaction id (it has written) or with its snapshot
    (``backend_xmin``): either way vacuum cannot remove row versions newer than that, so the
    job table's updates pile up as dead tuples. Since PostgreSQL 14 only sessions of this
    database (and those of none, e.g. a walsender with hot_standby_feedback) count.
    """
    a = _activity.c
    xid_age = func.greatest(func.age(a.backend_xid), func.age(a.backend_xmin), type_=Integer)
    return (
        select(
            a.pid,
            a.usename,
            a.application_name,
            a.state,
            func.now() - a.xact_start,
            xid_age,
        )
        .where(
            or_(a.backend_xid.is_not(None), a.backend_xmin.is_not(None)),
            a.pid != func.pg_backend_pid(),
            or_(a.datname == func.current_database(), a.datname.is_(None)),
        )
        .order_by(xid_age.desc().nulls_last(), a.xact_start)
        .limit(1)
    )


@cache
def oldest_prepared() -> Select[Any]:
    """The oldest prepared (two-phase) transaction of this database: it pins the horizon too."""
    p = _prepared.c
    return (
        select(p.gid, func.now() - p.prepared, func.age(p.transaction, type_=Integer))
        .where(p.database == func.current_database())
        .order_by(p.prepared)
        .limit(1)
    )


@cache
def slot_horizons() -> Select[Any]:
    """Replication slots holding an xmin (all tables) or catalog_xmin (system catalogs)."""
    s = _slots.c
    return (
        select(
            s.slot_name,
            s.slot_type,
            s.active,
            func.age(s.xmin, type_=Integer),
            func.age(s.catalog_xmin, type_=Integer),
        )
        .where(or_(s.xmin.is_not(None), s.catalog_xmin.is_not(None)))
        .order_by(s.slot_name)
    )
