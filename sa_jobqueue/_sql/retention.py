"""Pruning finished jobs, one worker at a time."""

from __future__ import annotations

from functools import cache
from typing import Final

from sqlalchemy import (
    BigInteger,
    Delete,
    Integer,
    Select,
    bindparam,
    delete,
    exists,
    func,
    literal,
    select,
)

from ..models import (
    dependencies_table,
    jobs_table,
    key_starts_table,
    prunable,
    queues_table,
)
from .clock import seconds
from .history import count_deleted

#: The advisory lock that lets one worker at a time prune (an arbitrary constant: "sajq").
PRUNE_LOCK: Final = 0x736A_7170

j = jobs_table.c


@cache
def try_prune_lock() -> Select[bool]:
    """Take the prune lock for this transaction, if no other session holds it."""
    return select(func.pg_try_advisory_xact_lock(literal(PRUNE_LOCK, type_=BigInteger)))


@cache
def prune() -> Select[int]:
    """Delete up to ``:limit`` succeeded or cancelled jobs finished ``:retention`` seconds ago;
    return how many.

    Dead jobs are never pruned: they wait to be requeued or purged. Bounded, so one call holds
    its locks for a short while; the oldest go first; rows locked by someone else are skipped.
    Those the history's fold has not reached are counted into it as they go (see
    :mod:`.history`): pruning never waits for the fold, and loses no finish from the history.
    """
    doomed = (
        select(j.id)
        .where(prunable(), j.finished_at < func.now() - seconds("retention"))
        .order_by(j.finished_at)
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
        .cte("doomed")
        .prefix_with("MATERIALIZED")
    )
    gone = (
        delete(jobs_table)
        .where(j.id == doomed.c.id)
        .returning(j.queue, j.status, j.finished_at)
        .cte("gone")
    )
    counted = count_deleted(gone).cte("counted")
    return select(func.count()).select_from(gone).add_cte(counted)


@cache
def prune_key_starts() -> Delete:
    """Delete up to ``:limit`` counts of starts per key whose window is over, or whose queue no
    longer has a rate per key: the next start of such a key writes a new row anyway."""
    k = key_starts_table.c
    q = queues_table.c
    current = exists().where(
        q.queue == k.queue,
        q.key_rate_period.is_not(None),
        k.window_start + q.key_rate_period > func.now(),
    )
    doomed = (
        select(k.queue, k.task, k.key)
        .where(~current)
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
        .cte("doomed")
        .prefix_with("MATERIALIZED")
    )
    return delete(key_starts_table).where(
        k.queue == doomed.c.queue, k.task == doomed.c.task, k.key == doomed.c.key
    )


@cache
def prune_edges() -> Delete:
    """Delete up to ``:limit`` settled dependency edges whose waiting job is gone (pruned or
    purged): history nobody can read any more."""
    e = dependencies_table.c
    gone = (
        select(e.job_id, e.depends_on)
        .where(~e.pending, ~exists().where(j.id == e.job_id))
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
        .cte("gone")
        .prefix_with("MATERIALIZED")
    )
    return delete(dependencies_table).where(
        e.job_id == gone.c.job_id, e.depends_on == gone.c.depends_on
    )
