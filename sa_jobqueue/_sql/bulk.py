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
    order: Literal["id", "finished_at"] = "id",
) -> CTE:
    """The MATERIALIZED CTE ``picked`` of up to ``:b_batch`` ids, each row locked, SKIP LOCKED.

    By ``:b_ids`` (``ids``), or by the filters switched on within the partial index
    ``within``, walking up from ``:b_after_id``. Either way ``:b_statuses`` narrows it to the
    statuses the action applies to.
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
    return (
        select(j.id)
        .where(*conditions, *extra)
        .order_by(j.finished_at if order == "finished_at" else j.id)
        .limit(bindparam("b_batch", type_=Integer))
        .with_for_update(skip_locked=True)
        .cte("picked")
        .prefix_with("MATERIALIZED")
    )


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

    ``within`` is the partial index a filter reads (``None`` with ids): "pruned" walks the
    prune index in ``finished_at`` order, so a batch reads about as many entries as it takes
    however long the history; "dead" walks the dead index by id, as a retry does.
    """
    picked = picked_ids(
        ids=ids,
        within=within,
        queue=queue,
        task=task,
        older_than=older_than,
        order="finished_at" if within == "pruned" else "id",
    )
    # Compare-and-set on a finished status: a job that was requeued after the pick stays.
    deleted = (
        delete(jobs_table)
        .where(j.id == picked.c.id, j.status.in_(FINISHED_STATUSES))
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
    picks), so that the confirmation's count is what the clicks would go through.
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
    some = (
        select(literal_column("1").label("one"))
        .select_from(jobs_table)
        .where(*conditions)
        .limit(bindparam("upto", type_=Integer))
        .subquery("some")
    )
    return select(func.count()).select_from(some)
