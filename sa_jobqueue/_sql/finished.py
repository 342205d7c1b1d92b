"""Finished jobs, from outside a worker: requeueing dead ones and purging old ones.

The worker's own pruning of succeeded and cancelled jobs is in :mod:`.retention`.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    ColumnElement,
    Integer,
    Select,
    Text,
    Update,
    any_,
    bindparam,
    cast,
    delete,
    exists,
    func,
    select,
    update,
)
from sqlalchemy.sql.dml import ReturningDelete

from .._validation import MAX_ATTEMPTS
from ..models import DEAD, QUEUED, UNIQUE_STATUSES, dead, jobs_table
from .arrays import id_array
from .clock import seconds
from .listing import job_filters

j = jobs_table.c


@cache
def requeue_dead(reset: bool) -> Update:
    """Move dead job ``:job_id`` back to ``queued``, due now; returns its queue, or no row.

    Compare-and-set on ``status = 'dead'``: a job that is anything else is left alone. With
    ``reset`` its attempts start again from 0; otherwise ``attempts`` is kept and
    ``max_attempts`` raised by its current value (see :meth:`JobQueue.requeue`).
    ``last_error`` is kept, so the next attempt's handler and the operator can still see why
    it died.
    """
    stmt = update(jobs_table).where(j.id == bindparam("job_id", type_=BigInteger))
    return _requeued(stmt, reset).returning(j.queue)


@cache
def requeue_dead_batch(
    reset: bool, *, queue: bool, task: bool, older_than: bool, ids: bool = False
) -> Select[Any]:
    """Requeue up to ``:b_batch`` dead jobs with id > ``:b_after_id`` matching the filters.

    Filters: ``:b_queue``, ``:b_task``, ``:b_older_than`` (seconds since ``created_at``), those
    switched on (``b_``: the UPDATE keeps the columns' own names for its SET clause), or with
    ``ids`` those of the array ``:b_ids`` (the dashboard's selected rows) instead. Each
    job is requeued as :func:`requeue_dead` does. Returns ``(id, queue)`` for every job the
    batch picked, lowest id first, ``queue`` NULL for one left dead because a live job of
    its task holds its unique key: the highest id is where the next batch starts.
    """
    # The ids are picked in a MATERIALIZED CTE, run exactly once, so the statement locks at
    # most :b_batch rows (see claiming.claim); SKIP LOCKED passes over a job another session is
    # requeueing or purging at this moment instead of waiting for it. dead() repeats the dead
    # index's predicate, so the pick reads that index, not the finished history; walking up
    # from the last batch's highest id, a batch never picks again the jobs an earlier one
    # left dead.
    chosen = job_filters(
        statuses=False,
        queue=queue,
        task=task,
        older_than=older_than,
        after=True,
        newest_first=False,
        prefix="b_",
    )
    if ids:
        chosen.append(j.id == any_(id_array("b_ids")))
    picked = (
        select(j.id)
        .where(dead(), *chosen)
        .order_by(j.id)
        .limit(bindparam("b_batch", type_=Integer))
        .with_for_update(skip_locked=True)
        .cte("picked")
        .prefix_with("MATERIALIZED")
    )
    # Two dead jobs of one task with one unique key (each died holding it, in turn) are
    # both free by the check in _requeued, which sees neither live: the batch requeues the
    # lower id alone and leaves the other dead, as if the first were live already. Requeued
    # together, the second broke the unique index and aborted the caller's transaction.
    twin = jobs_table.alias("twin")
    others = picked.alias("others")
    twin_picked = exists().where(
        twin.c.id.in_(select(others.c.id)),
        twin.c.id < j.id,
        twin.c.task == j.task,
        twin.c.unique_key == j.unique_key,
    )
    stmt = update(jobs_table).where(j.id == picked.c.id, ~twin_picked)
    requeued = _requeued(stmt, reset).returning(j.id, j.queue).cte("requeued")
    return (
        select(picked.c.id, requeued.c.queue)
        .select_from(picked.outerjoin(requeued, requeued.c.id == picked.c.id))
        .order_by(picked.c.id)
    )


def _requeued(stmt: Update, reset: bool) -> Update:
    """``stmt`` made a compare-and-set of a dead job back to ``queued``, due now."""
    live = jobs_table.alias("live")
    # A dead job's unique key is free for a new job of the same task; if one now holds it,
    # requeueing would break the unique index, and the error would abort the caller's
    # transaction. Not requeueing (no row) leaves it usable. A concurrent enqueue of the same
    # key can still win the race, and then the unique violation does propagate.
    key_taken = exists().where(
        live.c.task == j.task,
        live.c.unique_key == j.unique_key,
        live.c.status.in_(UNIQUE_STATUSES),
    )
    stmt = stmt.where(j.status == DEAD, ~key_taken)
    if reset:
        stmt = stmt.values(attempts=0)
    else:
        # In bigint, so that attempts + max_attempts cannot overflow the integer columns
        # before LEAST caps it; a job that has used up the largest limit cannot be extended.
        stmt = stmt.where(j.attempts < MAX_ATTEMPTS).values(
            max_attempts=func.least(cast(j.attempts, BigInteger) + j.max_attempts, MAX_ATTEMPTS)
        )
    return stmt.values(
        status=QUEUED,
        visible_at=func.now(),
        finished_at=None,
        worker=None,
        cancel_requested=False,
    )


def _purgeable(queue: bool, task: bool) -> list[ColumnElement[bool]]:
    conditions = [
        j.status == any_(bindparam("statuses", type_=ARRAY(Text))),
        j.finished_at < func.now() - seconds("older_than"),
    ]
    if queue:
        conditions.append(j.queue == bindparam("queue", type_=Text))
    if task:
        conditions.append(j.task == bindparam("task", type_=Text))
    return conditions


@cache
def purge_batch(queue: bool, task: bool) -> ReturningDelete[int]:
    """Delete up to ``:batch`` finished jobs past ``:older_than`` seconds with id > ``:after_id``.

    Returns the deleted ids. ``finished_at`` is NULL for queued and running jobs, so they can
    never match, whatever ``:statuses`` holds.
    """
    # The ids are picked in a MATERIALIZED CTE (run exactly once, so it locks at most :batch
    # rows; see claiming.claim) walking the primary key upwards from the previous batch's
    # last id. Starting each batch from the top instead would re-read the dead index entries
    # and heap tuples of every earlier batch, which no vacuum has removed yet.
    doomed = (
        select(j.id)
        .where(*_purgeable(queue, task), j.id > bindparam("after_id", type_=BigInteger))
        .order_by(j.id)
        .limit(bindparam("batch", type_=Integer))
        .with_for_update(skip_locked=True)
        .cte("doomed")
        .prefix_with("MATERIALIZED")
    )
    return delete(jobs_table).where(j.id == doomed.c.id).returning(j.id)


@cache
def count_purgeable(queue: bool, task: bool) -> Select[int]:
    """How many jobs :func:`purge_batch` would delete, all batches together."""
    return select(func.count()).where(*_purgeable(queue, task))
