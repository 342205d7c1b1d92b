"""Acting on many jobs at once: one bounded batch of cancel, delete or run-now per statement.

Retrying many dead jobs is :func:`.finished.requeue_dead_batch`. Each statement here picks
up to ``:b_batch`` jobs, either by id (``:b_ids``, an array) or by the list's filters
(``:b_statuses``, ``:b_queue``, ``:b_task``, ``:b_older_than``, past ``:b_after_id``), locks
those alone and changes each that is still in a state the action applies to.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Literal

from sqlalchemy import (
    ARRAY,
    BigInteger,
    ColumnElement,
    Integer,
    Select,
    Text,
    any_,
    bindparam,
    delete,
    func,
    literal_column,
    select,
    update,
)
from sqlalchemy.sql.selectable import CTE

from ..models import (
    CANCELLED,
    FINISHED_STATUSES,
    QUEUED,
    RUNNING,
    WAITING,
    claimable,
    dead,
    jobs_table,
    prunable,
)
from .arrays import id_array
from .dependencies import settle
from .listing import job_filters

j = jobs_table.c

#: Which jobs each action can pick; for a filter, also the partial index whose predicate the
#: pick repeats, so that it reads that index rather than the finished history.
Within = Literal["live", "pruned", "dead"]


def picked_ids(
    *,
    ids: bool,
    within: Within | None,
    queue: bool,
    task: bool,
    older_than: bool,
    extra: tuple[ColumnElement[bool], ...] = (),
    window: bool = False,
) -> CTE:
    """The MATERIALIZED CTE ``picked`` of up to ``:b_batch`` ids, each row locked, SKIP LOCKED.

    By ``:b_ids`` (``ids``), or by the filters switched on within the partial index
    ``within``, walking up from ``:b_after_id``; with ``window`` only ids up to
    ``:b_until`` (a range of the primary key). Either way ``:b_statuses``
    narrows it to the statuses the action applies to.
    """
    # MATERIALIZED runs the pick exactly once, so the statement locks at most :b_batch rows
    # (see claiming.claim); SKIP LOCKED passes over a job a worker or another click holds
    # at this moment instead of waiting for it: the outcome counts it as left as it was.
    conditions: list[ColumnElement[bool]] = [
        j.status == any_(bindparam("b_statuses", type_=ARRAY(Text)))
    ]
    if within is not None:
        conditions.append({"live": claimable, "pruned": prunable, "dead": dead}[within]())
    if ids:
        conditions.append(j.id == any_(id_array("b_ids")))
    else:
        conditions += job_filters(
            statuses=False,
            queue=queue,
            task=task,
            older_than=older_than,
            after=True,
            newest_first=False,
            prefix="b_",
        )
    if window:
        conditions.append(j.id <= _window_end())
    return (
        select(j.id)
        .where(*conditions, *extra)
        .order_by(j.id)
        .limit(bindparam("b_batch", type_=Integer))
        .with_for_update(skip_locked=True)
        .cte("picked")
        .prefix_with("MATERIALIZED")
    )


def _window_end() -> ColumnElement[Any]:
    # A parameter of its own, not :b_after_id + a length: a plain bound is what the planner
    # estimates a range of the primary key from.
    return bindparam("b_until", type_=BigInteger)


@cache
def cancel_batch(*, ids: bool, queue: bool, task: bool, older_than: bool) -> Select[Any]:
    """Cancel the picked jobs: a waiting or queued one ends ``cancelled`` (what waits for it
    is settled in the same statement, as :func:`.admin.cancel_queued` does for one), a running
    one has cancellation requested (as :func:`.admin.request_cancel`).

    Returns ``(id, cancelled, requested, settled)`` for every job picked, lowest id first;
    both flags false for one that changed state after the pick.
    """
    # A filter reads the claim index (queued and running jobs): no index holds waiting jobs,
    # so those are cancelled by id only; a filter over them would read the whole history.
    picked = picked_ids(
        ids=ids, within=None if ids else "live", queue=queue, task=task, older_than=older_than
    )
    cancelled = (
        update(jobs_table)
        .where(j.id == picked.c.id, j.status.in_([QUEUED, WAITING]))
        .values(status=CANCELLED, finished_at=func.now())
        .returning(j.id, j.status)
        .cte("cancelled")
    )
    requested = (
        update(jobs_table)
        .where(j.id == picked.c.id, j.status == RUNNING)
        .values(cancel_requested=True)
        .returning(j.id)
        .cte("requested")
    )
    return (
        select(
            picked.c.id,
            cancelled.c.id.is_not(None).label("cancelled"),
            requested.c.id.is_not(None).label("requested"),
            settle(cancelled).label("settled"),
        )
        .select_from(
            picked.outerjoin(cancelled, cancelled.c.id == picked.c.id).outerjoin(
                requested, requested.c.id == picked.c.id
            )
        )
        .order_by(picked.c.id)
    )


@cache
def delete_batch(
    within: Literal["pruned", "dead"] | None,
    *,
    ids: bool,
    queue: bool,
    task: bool,
    older_than: bool,
) -> Select[Any]:
    """Delete the picked finished jobs; returns ``(id, deleted)`` for every job picked.

    ``within`` is the partial index a filter reads (``None`` with ids): "dead" walks the dead
    index by id, as a retry does; "pruned" (succeeded and cancelled jobs) reads one window of
    ids, ``:b_after_id`` to ``:b_until``: the prune index holds neither queue
    nor task nor id, so a rare match (one queue's cancelled jobs) would otherwise be looked
    for through the whole history in one statement.
    """
    picked = picked_ids(
        ids=ids,
        within=within,
        queue=queue,
        task=task,
        older_than=older_than,
        window=within == "pruned",
    )
    # Compare-and-set on a finished status: a job that was requeued after the pick stays.
    # The ids as an array, probed in the primary key: joined with the CTE instead, a batch
    # the planner expects to be large can be deleted through a hash join over the whole table.
    chosen = func.array(select(picked.c.id).scalar_subquery())
    deleted = (
        delete(jobs_table)
        .where(j.id == any_(chosen), j.status.in_(FINISHED_STATUSES))
        .returning(j.id)
        .cte("deleted")
    )
    return (
        select(picked.c.id, deleted.c.id.is_not(None).label("deleted"))
        .select_from(picked.outerjoin(deleted, deleted.c.id == picked.c.id))
        .order_by(picked.c.id)
    )


@cache
def run_now_batch(*, ids: bool, queue: bool, task: bool, older_than: bool) -> Select[Any]:
    """Make the picked queued jobs due now (``visible_at = now()``); returns ``(id, queue)``
    for every job picked, ``queue`` NULL for one that was no longer queued and later."""
    # Only queued jobs: a running job's visible_at is its lease's end, which its worker and
    # the reaper go by; a waiting job runs when its dependencies let it, not before.
    later = (j.visible_at > func.now(),)
    picked = picked_ids(
        ids=ids,
        within=None if ids else "live",
        queue=queue,
        task=task,
        older_than=older_than,
        extra=later,
    )
    moved = (
        update(jobs_table)
        .where(j.id == picked.c.id, j.status == QUEUED, *later)
        .values(visible_at=func.now())
        .returning(j.id, j.queue)
        .cte("moved")
    )
    return (
        select(picked.c.id, moved.c.queue)
        .select_from(picked.outerjoin(moved, moved.c.id == picked.c.id))
        .order_by(picked.c.id)
    )


@cache
def count_matching(
    within: Within | None, *, queue: bool, task: bool, older_than: bool, later: bool = False
) -> Select[int]:
    """How many jobs of ``:b_statuses`` match the filters, up to ``:upto`` (a bounded count).

    The conditions a batch picks by (``later``: only jobs due in the future, as run-now
    picks), so that the confirmation's count is what the clicks would go through; "pruned"
    counts one window of ids, as :func:`delete_batch` picks.
    """
    conditions: list[ColumnElement[bool]] = [
        j.status == any_(bindparam("b_statuses", type_=ARRAY(Text))),
        *job_filters(
            statuses=False,
            queue=queue,
            task=task,
            older_than=older_than,
            after=False,
            newest_first=False,
            prefix="b_",
        ),
    ]
    if within is not None:
        conditions.append({"live": claimable, "pruned": prunable, "dead": dead}[within]())
    if later:
        conditions.append(j.visible_at > func.now())
    if within == "pruned":
        after = bindparam("b_after_id", type_=BigInteger)
        conditions += [j.id > after, j.id <= _window_end()]
    some = (
        select(literal_column("1").label("one"))
        .select_from(jobs_table)
        .where(*conditions)
        .limit(bindparam("upto", type_=Integer))
        .subquery("some")
    )
    return select(func.count()).select_from(some)
