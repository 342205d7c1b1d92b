"""The claim: the one statement that hands due jobs, and expired leases, to a worker.

The plain claim (:func:`claim`, :func:`claim_after`) is here whole, with the parts the limited
claim (``claim_limits``) builds on: the due rows of a queue (:func:`due_in_queue`), the picking
of rows in claim order (:func:`pick_due`) and the UPDATE that starts them (:func:`start_picked`).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import cache
from typing import Any, Final

from sqlalchemy import (
    CTE,
    BindParameter,
    ColumnElement,
    DateTime,
    Integer,
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
    or_,
    select,
    true,
    tuple_,
    update,
)
from sqlalchemy.sql.base import ReadOnlyColumnCollection

from ..models import CANCELLED, CLAIM_ORDER, DEAD, RUNNING, claimable, jobs_table, queues_table
from .attempt_history import appended
from .dependencies import settled_here

#: What the claim records when it takes a job back from a worker that stopped renewing it.
LEASE_EXPIRED: Final = "lease expired (worker lost)"
#: The outcome in ``attempt_history`` of an attempt whose lease a claim found expired.
LEASE_EXPIRED_OUTCOME: Final = "lease_expired"

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
    queue with a limit (a cap or a rate): its jobs are claimed by
    :func:`.claim_limits.claim_limited` alone.

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


def in_claim_order(columns: ReadOnlyColumnCollection[str, Any]) -> list[ColumnElement[Any]]:
    """The columns of ``columns`` (the jobs table's, or a CTE's that selected them) that
    :data:`~sa_jobqueue.models.CLAIM_ORDER` names, in its order: for an ORDER BY, or a row
    comparison with a claim position."""
    return [columns[name] for name in CLAIM_ORDER]


def _after(name: str) -> str:
    return "after_" + name


def position_binds() -> list[BindParameter[Any]]:
    """The claim position :func:`claim_after` starts past: a parameter ``:after_<column>`` for
    each column of the claim order, typed as the column is."""
    return [bindparam(_after(name), type_=j[name].type) for name in CLAIM_ORDER]


def position_params(position: tuple[Any, ...]) -> dict[str, Any]:
    """The parameters of :func:`claim_after` for ``position``: a row's values of the claim
    order's columns, in that order."""
    return {_after(name): value for name, value in zip(CLAIM_ORDER, position, strict=True)}


def picked_columns() -> list[ColumnElement[Any]]:
    """What a picked row carries: its ``id``, then the rest of its claim position (the claim
    returns the position as it was before the claim, when the UPDATE has changed
    ``visible_at``)."""
    return [j.id, *(column for column in in_claim_order(j) if column is not j.id)]


def due_in_queue(skip: ColumnElement[bool] | None = None) -> list[ColumnElement[bool]]:
    """The conditions of a job of ``:from_queue`` the claim may take now: claimable (queued, or
    running on a lease) and due (``visible_at`` passed), and not one ``skip`` names.

    ``claimable()`` repeats the claim index's partial predicate word for word, so the planner
    can use that index even for a generic (prepared) plan; the queue is an equality on its
    leading column, so the scan returns the queue's rows in claim order, with no sort.
    """
    due = [claimable(), j.queue == bindparam("from_queue", type_=Text), j.visible_at <= func.now()]
    if skip is not None:
        due.append(~skip)
    return due


def pick_due(
    *,
    after: bool,
    limit: ColumnElement[int],
    unlimited_only: bool,
    skip: ColumnElement[bool] | None = None,
) -> CTE:
    """The CTE ``picked``: up to ``limit`` due jobs of the queue in claim order, locked, skipping
    rows others hold locked; with ``after``, only those past the claim position
    ``:after_...``; with ``unlimited_only``, none at all from a paused or limited queue.

    What it prevents is said where each part is built.
    """
    # The SELECT ... FOR UPDATE SKIP LOCKED sits in a MATERIALIZED CTE and the UPDATE joins it.
    # Written as ``WHERE id IN (SELECT ... LIMIT ... FOR UPDATE)`` the planner may run the
    # subquery more than once and lock (and update) more rows than LIMIT; the fence makes it
    # run exactly once. One queue per claim keeps the scan in index order (an ``= ANY(array)``
    # on the leading column would return rows unordered and force a sort of the backlog).
    # A row comparison over the claim index's columns after ``queue``: an index condition, so
    # the scan starts at the position rather than stepping over the entries before it.
    past = tuple_(*in_claim_order(j)) > tuple_(*position_binds())
    # Compares the bound queue name, not the job's column: uncorrelated, so the planner runs
    # it once per claim, before the scan (a One-Time Filter over an InitPlan), as one probe of
    # the queues table's primary key. A queue without a row, or one with no setting, costs
    # that probe and nothing else; a paused or limited one makes the scan never start.
    held_back = exists().where(
        q.queue == bindparam("from_queue", type_=Text),
        or_(
            q.paused_at.is_not(None),
            q.concurrency.is_not(None),
            q.rate_limit.is_not(None),
            q.key_field.is_not(None),  # a cap or a rate per key
        ),
    )
    return (
        select(*picked_columns())
        .where(
            *due_in_queue(skip),
            *([~held_back] if unlimited_only else []),
            *([past] if after else []),
        )
        .order_by(*in_claim_order(j))
        .limit(limit)
        .with_for_update(skip_locked=True)
        .cte("picked")
        .prefix_with("MATERIALIZED")
    )


def start_picked(picked: CTE, *, few: bool = False, durable: bool = False) -> Update:
    """The UPDATE that starts (or ends, for a lost last attempt) each picked row.

    ``few``: the picked rows' LIMIT is not a constant (the limited claim's room), so the
    planner cannot tell they are few and may join them to the whole jobs table with a hash or
    merge join, reading all of it. Matched as ``id = ANY (ARRAY(...))`` instead, each is one
    primary-key probe; the row's ``visible_at`` before the claim is then looked up among the
    picked rows (see :func:`_visible_before`; the limited claim, always from the head, needs
    no claim position, but a job handed back unstarted takes its place again with it: see
    ``transitions.release``).

    ``durable``: the claim commits with others' writes that must reach the disk before the
    commit returns (completions), so it does not turn ``synchronous_commit`` off.
    """
    cancelled = and_(j.status == RUNNING, j.cancel_requested)
    exhausted = and_(j.status == RUNNING, j.attempts >= j.max_attempts)
    ends = or_(cancelled, exhausted)  # a lost attempt that is not to be run again
    lease_lost = func.jsonb_build_object(
        literal("type"), literal("LeaseExpired"), literal("message"), literal(LEASE_EXPIRED)
    )
    return (
        update(jobs_table)
        .where(
            j.id == func.any(func.array(select(picked.c.id).scalar_subquery()))
            if few
            else j.id == picked.c.id,
            *([] if durable else [claim_commits_async()]),
        )
        .values(
            status=case((cancelled, CANCELLED), (exhausted, DEAD), else_=RUNNING),
            attempts=case((ends, j.attempts), else_=j.attempts + 1),
            visible_at=func.now() + j.lease,
            started_at=case((ends, j.started_at), else_=func.now()),
            finished_at=case((ends, func.now()), else_=None),
            worker=bindparam("worker", type_=Text),
            # A reclaimed job keeps a note of why its previous attempt ended, and an entry for
            # it in its history (its duration: from its start until this claim found it lost).
            last_error=case((j.status == RUNNING, lease_lost), else_=j.last_error),
            attempt_history=case(
                (j.status == RUNNING, appended(literal(LEASE_EXPIRED_OUTCOME), lease_lost)),
                else_=j.attempt_history,
            ),
            # The attempt that starts has reported nothing yet: a progress on the row is an
            # earlier attempt's, which would otherwise be shown as this one's until its first
            # report was written. A lost last attempt that ends here keeps its own.
            progress=case((ends, j.progress), else_=None),
            progress_message=case((ends, j.progress_message), else_=None),
            progress_at=case((ends, j.progress_at), else_=None),
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
            # For the handler's context (``JobContext.created_at``): read here, not queried.
            j.created_at,
            j.priority if few else picked.c.priority,
            _visible_before(picked).label("visible_at") if few else picked.c.visible_at,
            # A lost last attempt ends here (dead, or cancelled): what waits for it is settled.
            settled_here(),
        )
    )


def _visible_before(picked: CTE) -> ColumnElement[datetime]:
    """A claimed row's ``visible_at`` before the claim, for an UPDATE matched by ``id = ANY``
    (``start_picked``'s ``few``): looked up by id in one JSON object built once from the
    picked rows (an InitPlan), a binary search per row. A subquery per row over the picked
    rows would read all of them for each: n x n for a batch fill of thousands."""
    before = select(func.jsonb_object_agg(picked.c.id, picked.c.visible_at)).scalar_subquery()
    return cast(before.op("->>")(cast(j.id, Text)), DateTime(timezone=True))


def _claim(*, after: bool) -> Update:
    limit = bindparam("limit", type_=Integer)
    return start_picked(pick_due(after=after, limit=limit, unlimited_only=True))


def rate_window(period: ColumnElement[timedelta] | None = None) -> ColumnElement[datetime]:
    """The start of the rate window ``now()`` falls in: windows of ``period`` (the queue's
    ``rate_period``) from the Unix epoch, so a limit of N per second counts whole seconds of
    the database clock."""
    seconds = func.extract("epoch", q.rate_period if period is None else period)
    start = func.floor(func.extract("epoch", func.now()) / seconds) * seconds
    return func.to_timestamp(start)
