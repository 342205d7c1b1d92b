"""The dashboard overview's statements for one page of queues: which queues, then their figures.

An application with a queue per customer has thousands of them. The overview shows a page of
them by name, so it first reads the names (every queue with something to show: a backlog,
dead jobs, jobs that finished in the chart's window, a pause or a limit) and how many there
are, then each figure for the page's names alone (``:names``), rather than every queue's
figures to keep a hundred of them.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import (
    ARRAY,
    ColumnElement,
    Integer,
    Select,
    Text,
    any_,
    bindparam,
    func,
    or_,
    select,
    union,
)

from ..models import RUNNING, claimable, dead, jobs_table, prunable, queues_table
from .clock import seconds
from .dashboard import dead_per_queue, finished_per_minute, waiting_per_queue
from .queues import all_limits, limited, paused_queues
from .stats import live_per_queue

j = jobs_table.c
q = queues_table.c


@cache
def queue_page() -> Select[int, list[str]]:
    """How many queues there are to show, and the names of up to ``:shown`` of them, by name,
    after ``:after`` ("" for the first).

    Each name comes from an index, never the history: the claim index (a backlog), the dead
    index, the prune and dead indexes for the last ``:window`` seconds, the pending edges of
    waiting jobs, and the queues table's rows with a pause or a limit.
    """
    waiting = waiting_per_queue().with_only_columns(j.queue).group_by(None).order_by(None)
    # DISTINCT in each part: the claim and dead indexes lead with the queue, so each part is
    # an index-only scan that keeps one name per run of equal ones, and the union hashes a
    # few names instead of every backlog and dead entry (20,000 and 30,000 of them: 35 ms).
    names = union(
        select(j.queue).where(claimable()).distinct(),
        select(j.queue).where(dead()).distinct(),
        select(j.queue)
        .where(or_(prunable(), dead()), j.finished_at >= func.now() - seconds("window"))
        .distinct(),
        waiting,
        paused_queues().with_only_columns(q.queue).order_by(None),
        limited().with_only_columns(q.queue),
    ).cte("names")
    shown = (
        select(names.c.queue)
        .where(names.c.queue > bindparam("after", type_=Text))
        .order_by(names.c.queue)
        .limit(bindparam("shown", type_=Integer))
    )
    total = select(func.count()).select_from(names).scalar_subquery()
    return select(total, func.array(shown.scalar_subquery()))


def _on_page(statement: Any, queue: ColumnElement[str]) -> Select[Any]:
    # Any: Select is generic in its columns, and this keeps them (a WHERE added, no more).
    narrowed: Select[Any] = statement.where(queue == any_(bindparam("names", type_=ARRAY(Text))))
    return narrowed


@cache
def live_on_page() -> Select[Any]:
    """:func:`.stats.live_per_queue` for the queues ``:names``, and their running jobs with a
    live lease (those holding slots: :func:`.queues.live_leases`) from the same read."""
    holding = func.count().filter(j.status == RUNNING, j.visible_at > func.now())
    return _on_page(live_per_queue().add_columns(holding), j.queue)


@cache
def dead_on_page() -> Select[Any]:
    """:func:`.dashboard.dead_per_queue` for the queues ``:names``."""
    return _on_page(dead_per_queue(), j.queue)


@cache
def waiting_on_page() -> Select[Any]:
    """:func:`.dashboard.waiting_per_queue` for the queues ``:names``."""
    return _on_page(waiting_per_queue(), j.queue)


@cache
def finished_on_page() -> Select[Any]:
    """:func:`.dashboard.finished_per_minute` for the queues ``:names``."""
    return _on_page(finished_per_minute(), j.queue)


@cache
def paused_on_page() -> Select[Any]:
    """:func:`.queues.paused_queues` for the queues ``:names``."""
    return _on_page(paused_queues(), q.queue)


@cache
def limits_on_page() -> Select[Any]:
    """:func:`.queues.all_limits` for the queues ``:names``."""
    return _on_page(all_limits(), q.queue)
