"""The claim: the one statement that hands due jobs, and expired leases, to a worker."""

from __future__ import annotations

from functools import cache
from typing import Final

from sqlalchemy import (
    BigInteger,
    DateTime,
    Integer,
    SmallInteger,
    Text,
    Update,
    and_,
    bindparam,
    case,
    cast,
    func,
    literal,
    or_,
    select,
    tuple_,
    update,
)

from ..models import (
    CANCELLED,
    DEAD,
    RUNNING,
    claimable,
    jobs_table,
)

#: What the claim records when it takes a job back from a worker that stopped renewing it.
LEASE_EXPIRED: Final = "lease expired (worker lost)"

j = jobs_table.c


@cache
def claim() -> Update:
    """Claim up to ``:limit`` jobs from ``:from_queue`` for ``:worker``, in one statement.

    Eligible rows are queued jobs whose time has come and running jobs whose lease has expired
    (their worker died or stalled): reclaim rides in the claim, so no reaper process is needed
    and a lost job is picked up by whoever polls next. A reclaimed job with no attempts left
    is not run again but moved to ``dead``, and one whose cancellation was requested is moved
    to ``cancelled``; the caller skips rows that come back in a finished state.

    Each row ends with its claim position (``priority``, ``visible_at`` before the claim):
    with the row's ``id``, where :func:`claim_after` can start the next claim.
    """
    return _claim(after=False)


@cache
def claim_after() -> Update:
    """:func:`claim`, taking only rows past ``(:after_priority, :after_visible_at, :after_id)``
    in claim order.

    The claim index holds an entry for each version a job's row had while queued or running,
    and a claimed or finished job's old entries stay until VACUUM removes them. They gather at
    the head of the queue's range, in front of the jobs still waiting, and a claim from the
    head steps over every one of them. Started past the last row the previous claim took, the
    index scan begins where the waiting jobs are. A job due *before* that position (a higher
    priority, an earlier ``visible_at``) is not seen by it: the worker claims from the head
    again after a short claim and at least once a second (see the worker's claimer).
    """
    return _claim(after=True)


def _claim(*, after: bool) -> Update:
    # The SELECT ... FOR UPDATE SKIP LOCKED sits in a MATERIALIZED CTE and the UPDATE joins it.
    # Written as ``WHERE id IN (SELECT ... LIMIT ... FOR UPDATE)`` the planner may run the
    # subquery more than once and lock (and update) more rows than LIMIT; the fence makes it
    # run exactly once. One queue per claim keeps the scan in index order (an ``= ANY(array)``
    # on the leading column would return rows unordered and force a sort of the backlog).
    # ``claimable()`` repeats the partial index's predicate word for word so
    # the planner can use that index even for a generic (prepared) plan.
    position = tuple_(j.priority, j.visible_at, j.id)
    past = position > tuple_(
        bindparam("after_priority", type_=SmallInteger),
        bindparam("after_visible_at", type_=DateTime(timezone=True)),
        bindparam("after_id", type_=BigInteger),
    )
    picked = (
        select(j.id, j.priority, j.visible_at)
        .where(
            claimable(),
            j.queue == bindparam("from_queue", type_=Text),
            j.visible_at <= func.now(),
            *([past] if after else []),
        )
        .order_by(j.priority, j.visible_at, j.id)
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
        .cte("picked")
        .prefix_with("MATERIALIZED")
    )
    cancelled = and_(j.status == RUNNING, j.cancel_requested)
    exhausted = and_(j.status == RUNNING, j.attempts >= j.max_attempts)
    ends = or_(cancelled, exhausted)  # a lost attempt that is not to be run again
    lease_lost = func.jsonb_build_object(
        literal("type"), literal("LeaseExpired"), literal("message"), literal(LEASE_EXPIRED)
    )
    return (
        update(jobs_table)
        .where(j.id == picked.c.id)
        .values(
            status=case((cancelled, CANCELLED), (exhausted, DEAD), else_=RUNNING),
            attempts=case((ends, j.attempts), else_=j.attempts + 1),
            visible_at=func.now() + j.lease,
            started_at=case((ends, j.started_at), else_=func.now()),
            finished_at=case((ends, func.now()), else_=None),
            worker=bindparam("worker", type_=Text),
            # A reclaimed job keeps a note of why its previous attempt ended.
            last_error=case((j.status == RUNNING, lease_lost), else_=j.last_error),
        )
        # The payload comes back as text and each job decodes its own: a payload Python cannot
        # decode (nested deeper than its recursion limit) then fails that one job, not the
        # whole claimed batch, whose rows would all be stuck running until their leases expire.
        .returning(
            j.id,
            j.queue,
            j.task,
            cast(j.payload, Text).label("payload"),
            j.status,
            j.attempts,
            j.max_attempts,
            j.lease,
            j.trace_context,
            j.backoff,
            picked.c.priority,
            picked.c.visible_at,
        )
    )
