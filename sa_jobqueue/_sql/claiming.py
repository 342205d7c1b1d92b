"""The claim: the one statement that hands due jobs, and expired leases, to a worker."""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import cache
from typing import Any, Final

from sqlalchemy import (
    CTE,
    BigInteger,
    ColumnElement,
    DateTime,
    Integer,
    Select,
    SmallInteger,
    Text,
    Update,
    and_,
    bindparam,
    case,
    cast,
    exists,
    func,
    literal,
    literal_column,
    null,
    or_,
    select,
    true,
    tuple_,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY

from ..models import (
    CANCELLED,
    DEAD,
    RUNNING,
    claimable,
    jobs_table,
    queues_table,
)

#: What the claim records when it takes a job back from a worker that stopped renewing it.
LEASE_EXPIRED: Final = "lease expired (worker lost)"

j = jobs_table.c
q = queues_table.c


def claim_commits_async() -> ColumnElement[bool]:
    """A condition that is always true and turns ``synchronous_commit`` off for this transaction.

    A one-time filter (an InitPlan, run once per statement, before any row): the claim runs in
    autocommit, so "this transaction" is the claim alone, and the connection keeps its setting.

    Why a claim need not wait for the disk: losing it in a server crash (its last fraction of
    a second) loses nothing a durable claim would keep. Its rows come back as they were:
    queued jobs queued with the attempt uncounted, expired leases expired, and the next claim
    decides them again. Any transaction that later commits durably flushes the WAL up to its
    own commit record, claims before it included, so a completion never outlives the claim
    it fences; what the worker that held the jobs sends later is fenced as always, so at
    most one completion of a job's attempt commits, with its own writes only. The handler
    may have started before the crash: at-least-once execution, as for any crash during an
    attempt. The flush was most of an idle worker's pickup latency: one fsync, about 1 ms on
    a local SSD and several under load.
    """
    setting = func.set_config(
        literal_column("'synchronous_commit'"), literal_column("'off'"), true()
    )
    return select(setting).scalar_subquery().is_not(None)


@cache
def claim() -> Update:
    """Claim up to ``:limit`` jobs from ``:from_queue`` for ``:worker``, in one statement.

    Eligible rows are queued jobs whose time has come and running jobs whose lease has expired
    (their worker died or stalled): reclaim rides in the claim, so no reaper process is needed
    and a lost job is picked up by whoever polls next. A reclaimed job with no attempts left
    is not run again but moved to ``dead``, and one whose cancellation was requested is moved
    to ``cancelled``; the caller skips rows that come back in a finished state.

    A paused queue (a row in ``sa_jobqueue_queues`` with ``paused_at`` set) gives nothing,
    reclaims included: its expired leases wait for the resume like its queued jobs. So does a
    queue with a limit (a cap or a rate): its jobs are claimed by :func:`claim_limited` alone.

    The claim's own transaction commits without waiting for its WAL to reach disk
    (``synchronous_commit`` off for that transaction only): see :func:`claim_commits_async`.

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


#: How long after a cap is set each limited claim of the queue recounts its running jobs from
#: the jobs table rather than trusting the recorded holders: longer than any claim takes, so a
#: claim that began before the cap was committed (and so took no slots) is counted once it has.
RECOUNT_FOR: Final = timedelta(seconds=2)


def _picked(*, after: bool, limit: ColumnElement[int], unlimited_only: bool) -> CTE:
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
    # Compares the bound queue name, not the job's column: uncorrelated, so the planner runs
    # it once per claim, before the scan (a One-Time Filter over an InitPlan), as one probe of
    # the queues table's primary key. A queue without a row, or one with no setting, costs
    # that probe and nothing else; a paused or limited one makes the scan never start.
    held_back = exists().where(
        q.queue == bindparam("from_queue", type_=Text),
        or_(q.paused_at.is_not(None), q.concurrency.is_not(None), q.rate_limit.is_not(None)),
    )
    return (
        select(j.id, j.priority, j.visible_at)
        .where(
            claimable(),
            j.queue == bindparam("from_queue", type_=Text),
            j.visible_at <= func.now(),
            *([~held_back] if unlimited_only else []),
            *([past] if after else []),
        )
        .order_by(j.priority, j.visible_at, j.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
        .cte("picked")
        .prefix_with("MATERIALIZED")
    )


def _claim_picked(picked: CTE) -> Update:
    """The UPDATE that starts (or ends, for a lost last attempt) each picked row."""
    cancelled = and_(j.status == RUNNING, j.cancel_requested)
    exhausted = and_(j.status == RUNNING, j.attempts >= j.max_attempts)
    ends = or_(cancelled, exhausted)  # a lost attempt that is not to be run again
    lease_lost = func.jsonb_build_object(
        literal("type"), literal("LeaseExpired"), literal("message"), literal(LEASE_EXPIRED)
    )
    return (
        update(jobs_table)
        .where(j.id == picked.c.id, claim_commits_async())
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


def _claim(*, after: bool) -> Update:
    limit = bindparam("limit", type_=Integer)
    return _claim_picked(_picked(after=after, limit=limit, unlimited_only=True))


def rate_window() -> ColumnElement[datetime]:
    """The start of the rate window ``now()`` falls in: windows of ``rate_period`` from the
    Unix epoch, so a limit of N per second counts whole seconds of the database clock."""
    period = func.extract("epoch", q.rate_period)
    start = func.floor(func.extract("epoch", func.now()) / period) * period
    return func.to_timestamp(start)


@cache
def limits() -> Select[Any]:
    """Lock ``:from_queue``'s settings row and read what its limited claim needs.

    The first statement of a limited claim's transaction. The lock makes the queue's claims
    take turns (queues without limits never take it); the row comes back as the last claim
    committed it, so the rate window is read exactly. Returns: paused, the cap, the recorded
    holders, whether to recount them, the rate limit, the starts its window has left (NULL: no rate
    limit; 0 or less: none), that window's start, and the seconds until the next window.
    """
    window = rate_window()
    left = case(
        (q.rate_limit.is_(None), null()),
        (q.rate_window == window, q.rate_limit - q.rate_count),
        # The window moved on past this transaction's now(): a claim that started earlier
        # and waited for the lock. It takes nothing; the next claim has a fresh clock.
        (q.rate_window > window, literal(0)),
        else_=q.rate_limit,
    )
    next_window = func.greatest(window, func.coalesce(q.rate_window, window)) + q.rate_period
    wait = func.extract("epoch", next_window - func.clock_timestamp())
    recount = or_(q.holders.is_(None), q.recount_until.is_(None), q.recount_until > func.now())
    return (
        select(
            q.paused_at.is_not(None),
            q.concurrency,
            q.holders,
            recount,
            q.rate_limit,
            left,
            window,
            wait,
        )
        .where(q.queue == bindparam("from_queue", type_=Text), _frozen_claims_end())
        .with_for_update()
    )


#: How long a limited claim's transaction may sit idle (between its statements, or before its
#: COMMIT) before the server ends the session: a worker frozen there holds the queue's lock.
IDLE_LIMIT_MS: Final = 2000


def _frozen_claims_end() -> ColumnElement[bool]:
    """Always true; sets ``idle_in_transaction_session_timeout`` for this transaction only."""
    setting = func.set_config(
        literal_column("'idle_in_transaction_session_timeout'"),
        literal_column(f"'{IDLE_LIMIT_MS}'"),
        true(),
    )
    return select(setting).scalar_subquery().is_not(None)


@cache
def claim_limited(*, recount: bool) -> Select[Any]:
    """Claim up to ``:limit`` jobs of the limited queue ``:from_queue``, within its cap.

    The second statement of the limited claim's transaction, after :func:`limits` locked the
    queue's row: its snapshot is taken after the lock was granted, so it sees every claim of
    the queue that committed before (they took turns on the row) and every job that finished.

    A slot is held by a job of the queue that is running with a live lease: ``:cap`` minus
    those is the room. They are the recorded ``:holders`` still running (a primary-key probe
    each, at most the cap), or, with ``recount``, every running job of the queue (a scan of
    its range of the claim index, for the first seconds of a new cap). A job whose lease has
    expired holds none: its worker is gone or stalled, and the job is claimable again, into a
    slot like any other. With ``:cap`` NULL (a rate limit alone) there is no room to count.

    The queue's row is updated in the same statement: the holders (those still running, and
    the jobs this claim started) and the rate window's count (``:window``, the starts
    ``:rate_used`` already in it, and this claim's).

    Each row is the room the claim had, then a claimed job as :func:`claim` returns it; when
    it took none, one row of the room and NULLs. Fewer jobs than the room: the queue had no
    more due; as many as the room, and the room below ``:limit``: the queue is at its cap.
    """
    cap = bindparam("cap", type_=Integer)
    limit = bindparam("limit", type_=Integer)
    running = [j.status == RUNNING, j.visible_at > func.now()]
    if recount:
        where = [claimable(), j.queue == bindparam("from_queue", type_=Text), *running]
    else:
        where = [j.id == func.any(bindparam("holders", type_=ARRAY(BigInteger))), *running]
    live = select(j.id).where(*where).cte("live")
    holding = select(func.count()).select_from(live).scalar_subquery()
    room = select(
        func.greatest(func.least(limit, func.coalesce(cap - holding, limit)), 0).label("room")
    ).cte("room")
    picked = _picked(after=False, limit=select(room.c.room).scalar_subquery(), unlimited_only=False)
    claimed = _claim_picked(picked).cte("claimed")
    started = select(claimed.c.id).where(claimed.c.status == RUNNING)
    starts = select(func.count()).select_from(started.subquery()).scalar_subquery()
    window = bindparam("window", type_=DateTime(timezone=True))
    used = bindparam("rate_used", type_=Integer)
    noted = (
        update(queues_table)
        .where(q.queue == bindparam("from_queue", type_=Text))
        .values(
            holders=case(
                (cap.is_(None), null()),
                else_=func.array(union_all(select(live.c.id), started).scalar_subquery()),
            ),
            recount_until=case(
                (cap.is_(None), null()),
                else_=func.coalesce(q.recount_until, func.now() + RECOUNT_FOR),
            ),
            rate_window=case((q.rate_limit.is_(None), null()), else_=window),
            rate_count=case((q.rate_limit.is_(None), 0), else_=used + starts),
        )
    )
    # One row at least: the room, with no job when the claim took none.
    return (
        select(room.c.room, *claimed.c)
        .select_from(room.outerjoin(claimed, true()))
        .add_cte(noted.cte("noted"))
    )
