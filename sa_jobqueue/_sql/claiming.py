"""The claim: the one statement that hands due jobs, and expired leases, to a worker."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from typing import Any, Final

from sqlalchemy import (
    CTE,
    BigInteger,
    Boolean,
    ColumnElement,
    DateTime,
    Float,
    Integer,
    Select,
    SmallInteger,
    Text,
    Update,
    and_,
    bindparam,
    case,
    cast,
    column,
    exists,
    func,
    literal,
    literal_column,
    null,
    or_,
    select,
    true,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, Insert, insert

from ..models import (
    CANCELLED,
    DEAD,
    RUNNING,
    claimable,
    jobs_table,
    key_starts_table,
    queues_table,
)
from . import transitions
from .dependencies import settle, settled_here

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


def _picked(
    *,
    after: bool,
    limit: ColumnElement[int],
    unlimited_only: bool,
    skip: ColumnElement[bool] | None = None,
) -> CTE:
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
        or_(
            q.paused_at.is_not(None),
            q.concurrency.is_not(None),
            q.rate_limit.is_not(None),
            q.key_field.is_not(None),  # a cap or a rate per key
        ),
    )
    return (
        select(j.id, j.priority, j.visible_at)
        .where(
            claimable(),
            j.queue == bindparam("from_queue", type_=Text),
            j.visible_at <= func.now(),
            *([~held_back] if unlimited_only else []),
            *([past] if after else []),
            *([] if skip is None else [~skip]),
        )
        .order_by(j.priority, j.visible_at, j.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
        .cte("picked")
        .prefix_with("MATERIALIZED")
    )


#: How many of a key-capped queue's due jobs one claim looks at, in claim order, for jobs whose
#: key has room: jobs further back wait until the ones in front start (or their keys free up).
KEY_SCAN: Final = 1000


def _picked_keyed(
    state: CTE,
    key: ColumnElement[str],
    room: ColumnElement[int],
    live_ids: ColumnElement[list[int]],
    skip: ColumnElement[bool] | None,
    rate: _KeyRate,
) -> tuple[CTE, ColumnElement[Any]]:
    """:func:`_picked` for a queue with limits per key: only jobs whose key has room under its
    cap per key and its rate per key; and the seconds until the next window of the rate per
    key when a due job was held back by it and the claim had room (else NULL)."""
    s = state.c
    from_queue = bindparam("from_queue", type_=Text)
    due = [claimable(), j.queue == from_queue, j.visible_at <= func.now()]
    if skip is not None:
        due.append(~skip)
    head = (
        select(j.id, j.priority, j.visible_at, j.task, key.label("k"))
        .where(*due)
        .order_by(j.priority, j.visible_at, j.id)
        .limit(KEY_SCAN)
        .cte("head")
        .prefix_with("MATERIALIZED")
    )
    rank = func.row_number().over(
        partition_by=(head.c.task, head.c.k),
        order_by=(head.c.priority, head.c.visible_at, head.c.id),
    )
    ranked = select(head, rank.label("rank")).where(head.c.k.is_not(None)).subquery("ranked")
    # The live holders of each (task, key), for the cap per key.
    live = (
        select(j.task, key.label("k"))
        # Cast: ``= ANY ((SELECT ...))`` would be read as ANY over the subquery's rows.
        .where(j.id == func.any(live_ids))
        .subquery("live")
    )
    per_key = (
        select(live.c.task, live.c.k, func.count().label("n"))
        .where(live.c.k.is_not(None))
        .group_by(live.c.task, live.c.k)
        .subquery("per_key")
    )
    # The starts of each (task, key) in the rate per key's current window, read after the
    # queue's row is locked (see KEY_STARTS_FUNCTION): only for the keys in the head.
    key_rate, key_period, window = rate.limit, rate.period, rate.window
    used = getattr(func, KEY_STARTS_FUNCTION)(
        from_queue,
        window,
        select(func.array_agg(head.c.task)).scalar_subquery(),
        select(func.array_agg(head.c.k)).scalar_subquery(),
    ).table_valued(column("task", Text), column("key", Text), column("starts", Integer))
    used_by_key = select(used).where(key_rate.is_not(None)).subquery("used")
    joined = ranked.outerjoin(
        per_key, and_(per_key.c.task == ranked.c.task, per_key.c.k == ranked.c.k)
    ).outerjoin(
        used_by_key, and_(used_by_key.c.task == ranked.c.task, used_by_key.c.key == ranked.c.k)
    )
    key_cap = select(s.key_cap).scalar_subquery()
    cap_room = or_(key_cap.is_(None), ranked.c.rank + func.coalesce(per_key.c.n, 0) <= key_cap)
    rate_room = or_(
        key_rate.is_(None), ranked.c.rank + func.coalesce(used_by_key.c.starts, 0) <= key_rate
    )
    checked = (
        select(ranked.c.id, and_(cap_room, rate_room).label("fits"), rate_room.label("rate_fits"))
        .select_from(joined)
        .cte("checked")
    )
    unkeyed = select(head.c.id).where(head.c.k.is_(None))
    eligible = select(checked.c.id).where(checked.c.fits).union_all(unkeyed)
    # Only a claim with room is held back by a key's rate: with none (a pause, a cap whose
    # slots are held, a used-up rate of the queue) the next window of a key would start nothing.
    rate_held = and_(room > 0, exists().where(~checked.c.rate_fits))
    key_wait = case(
        (rate_held, func.extract("epoch", window + key_period - func.clock_timestamp())),
        else_=null(),
    )
    picked = (
        select(j.id, j.priority, j.visible_at)
        .where(j.id.in_(eligible), *due)
        .order_by(j.priority, j.visible_at, j.id)
        .limit(room)
        .with_for_update(skip_locked=True)
        .cte("picked")
        .prefix_with("MATERIALIZED")
    )
    return picked, key_wait


@dataclass(frozen=True)
class _KeyRate:
    """The queue's rate per key, read once per statement: its count, its period and the start
    of the window ``now()`` falls in (each NULL without one), as this statement's snapshot has
    them (a rate set while the claim waited for the lock applies from the next claim)."""

    limit: ColumnElement[int]
    period: ColumnElement[timedelta]
    window: ColumnElement[datetime]

    @classmethod
    def read(cls) -> _KeyRate:
        row = (
            select(
                q.key_rate_limit.label("limit"),
                q.key_rate_period.label("period"),
                rate_window(q.key_rate_period).label("window"),
            )
            .where(q.queue == bindparam("from_queue", type_=Text))
            .cte("key_rate")
        )
        c = row.c
        return cls(
            select(c.limit).scalar_subquery(),
            select(c.period).scalar_subquery(),
            select(c.window).scalar_subquery(),
        )


def _claim_picked(picked: CTE, *, few: bool = False, durable: bool = False) -> Update:
    """The UPDATE that starts (or ends, for a lost last attempt) each picked row.

    ``few``: the picked rows' LIMIT is not a constant (the limited claim's room), so the
    planner cannot tell they are few and may join them to the whole jobs table with a hash or
    merge join, reading all of it. Matched as ``id = ANY (ARRAY(...))`` instead, each is one
    primary-key probe; the claim position (``visible_at`` before the claim) then comes back
    NULL, which the limited claim, always from the head, does not use.

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
            j.priority if few else picked.c.priority,
            null().label("visible_at") if few else picked.c.visible_at,
            # A lost last attempt ends here (dead, or cancelled): what waits for it is settled.
            settled_here(),
        )
    )


def _claim(*, after: bool) -> Update:
    limit = bindparam("limit", type_=Integer)
    return _claim_picked(_picked(after=after, limit=limit, unlimited_only=True))


def rate_window(period: ColumnElement[timedelta] | None = None) -> ColumnElement[datetime]:
    """The start of the rate window ``now()`` falls in: windows of ``period`` (the queue's
    ``rate_period``) from the Unix epoch, so a limit of N per second counts whole seconds of
    the database clock."""
    seconds = func.extract("epoch", q.rate_period if period is None else period)
    start = func.floor(func.extract("epoch", func.now()) / seconds) * seconds
    return func.to_timestamp(start)


#: The SQL function (revision sajq_0009) a limited claim starts with; see :func:`claim_limited`.
LOCK_FUNCTION: Final = "sa_jobqueue_lock_queue"
#: The columns of a limited claim's row before those of the job it claimed (see
#: :func:`claim_limited`).
LIMITED_COLUMNS: Final = 7
#: The SQL function (revision sajq_0010) that reads the starts per key in the current window of
#: a queue's rate per key, with a snapshot taken after the queue's row was locked.
KEY_STARTS_FUNCTION: Final = "sa_jobqueue_key_starts"


def _locked_state() -> CTE:
    """The queue's settings row, locked, with its live holders: :data:`LOCK_FUNCTION`'s row."""
    state = getattr(func, LOCK_FUNCTION)(bindparam("from_queue", type_=Text)).table_valued(
        column("is_paused", Boolean),
        column("cap", Integer),
        column("key_cap", Integer),
        column("key_name", Text),
        column("tracked", Boolean),
        column("rate_left", Integer),
        column("rate_wait", Float),
        column("window_start", DateTime(timezone=True)),
        column("window_used", Integer),
        column("live_ids", ARRAY(BigInteger)),
    )
    return select(state).cte("state")


@cache
def claim_limited(*, keyed: bool, completing: bool = False) -> Select[Any]:
    """Claim up to ``:limit`` jobs of the limited queue ``:from_queue``, within its limits.

    One statement in autocommit, like :func:`claim`. It starts with :data:`LOCK_FUNCTION`,
    which locks the queue's settings row (the claims of a limited queue take turns; queues
    without limits never take the lock) and then, in a statement of its own and so with a
    snapshot taken after the lock was granted, reads the row as the last claim committed it
    and the queue's live holders. A slot is held by a job of the queue that is running with a
    live lease: the recorded holders still running (a primary-key probe each, at most the
    cap), or, in the first seconds after a cap is set (``recount_until``), every running job
    of the queue (a scan of its range of the claim index: a claim that began before the cap
    was committed took no slot, so it is counted once it has). A job whose lease expired holds
    none: its worker is gone or stalled, and the job is claimable again, into a slot like any
    other. Counted in this statement's own snapshot, taken before the lock wait, a claim that
    committed meanwhile would look undone and its slots free: hence the function.

    The room is ``:limit``, cut to the cap's free slots and to the rate window's starts left;
    0 for a paused queue; ``:limit`` for a queue without a settings row (nothing to lock or
    count: a worker that still took it for limited claims as the plain claim would, and
    reads the limits again, told by ``limited``). The rest is :func:`claim`'s scan and
    update (its snapshot may predate the lock, but every row it takes is re-checked against
    its latest version, so a job another claim took is skipped).

    With ``keyed``, a job whose payload has the top-level field ``key_field`` also needs room
    under ``key_concurrency`` among the live holders of its task with the same key: the claim
    ranks the first ``KEY_SCAN`` due jobs per (task, key) in claim order and takes a job only
    if its rank plus its key's live holders is within the cap, so one key's jobs start one
    after another in claim order at a cap of 1.

    The queue's row is updated in the same statement: the holders (those still live, and the
    jobs this claim started) and the rate window's count.

    Each row is the room, the seconds until the next rate window when the current one is used
    up and the queue is not paused (else NULL), whether the queue has a settings row, whether it
    has a cap per key (the variant without ``keyed`` takes nothing from such a queue), the
    seconds until the next window of the rate per key when that rate held back a job and the
    room was not 0 (else NULL: a paused queue has no window to wait for), then a claimed job as
    :func:`claim` returns it; when the claim took none, one row with NULL job columns. Fewer
    jobs than the room: the queue had no more due; as many as the room, and the room below
    ``:limit``: the queue is at a limit.

    With ``completing``, the statement first completes ``:job_ids`` at ``:attempt_list`` as
    ``transitions.complete_many`` does (fenced), and the slots of those it completed are free
    for the claim that follows: one statement, and one durable commit, for a job's end and its
    successor's start (see the worker's ``HandOff``). The jobs it completed come back as the
    array ``completed`` on every row, and ``settled_batch`` is what settling their dependents
    returned (both NULL without ``completing``). A claimed job's columns follow, from
    :data:`LIMITED_COLUMNS` on.
    """
    limit = bindparam("limit", type_=Integer)
    state = _locked_state()
    s = state.c
    holding = cast(select(s.live_ids).scalar_subquery(), s.live_ids.type)
    skip: ColumnElement[bool] | None = None
    completed: ColumnElement[Any] = null()
    settled: ColumnElement[Any] = null()
    if completing:
        # ``worker=`` as it is: the statement's ``:worker`` parameter would otherwise be taken
        # for a new value of this UPDATE's ``worker`` column too (a parameter named as a column).
        done = transitions.complete_many_update().values(worker=j.worker).cte("done")
        released = select(done.c.id).scalar_subquery()
        # The jobs this statement completes hold no slot, whether or not the lock function's
        # snapshot saw them end; and none of them is claimed again by it (a job whose lease
        # ran out is both claimable and completable).
        kept = select(func.unnest(s.live_ids).label("id")).except_(select(done.c.id))
        holding = cast(func.array(kept.scalar_subquery()), s.live_ids.type)
        skip = j.id == func.any(func.array(released))
        # The batch's dependents are settled with it, once (settle() is a scalar subquery).
        completed = func.array(released)
        settled = settle(done)
    fits = func.least(
        limit,
        func.coalesce(s.cap - func.cardinality(holding), limit),
        func.coalesce(s.rate_left, limit),
    )
    # The variant without keys claims nothing from a queue that has a limit per key: the
    # worker read its limits before it was set, and asks again with the keyed variant.
    has_keys = s.key_name.is_not(None)
    held = s.is_paused if keyed else or_(s.is_paused, has_keys)
    one = select(literal(1).label("one")).subquery("one")
    room = (
        select(
            func.coalesce(case((held, 0), else_=func.greatest(fits, 0)), 0).label("room"),
            # A paused queue starts nothing when its rate window opens: nothing to wait for.
            case((s.is_paused, null()), else_=s.rate_wait).label("wait"),
            s.is_paused.is_not(None).label("limited"),
            has_keys.label("keyed"),
        )
        .select_from(one.outerjoin(state, true()))
        .cte("room")
    )
    room_left = select(room.c.room).scalar_subquery()
    key_wait: ColumnElement[Any] = null()
    if keyed:
        key = j.payload.op("->>")(select(s.key_name).scalar_subquery())
        rate = _KeyRate.read()
        picked, key_wait = _picked_keyed(state, key, room_left, holding, skip, rate)
    else:
        picked = _picked(after=False, limit=room_left, unlimited_only=False, skip=skip)
    claimed = _claim_picked(picked, few=True, durable=completing).cte("claimed")
    started = select(claimed.c.id).where(claimed.c.status == RUNNING)
    starts = select(func.count()).select_from(started.subquery()).scalar_subquery()
    holders = func.array_cat(holding, func.array(started.scalar_subquery()))
    recount_until = func.coalesce(q.recount_until, func.now() + RECOUNT_FOR)
    noted = (
        update(queues_table)
        .where(q.queue == bindparam("from_queue", type_=Text))
        .values(
            holders=select(case((s.tracked, holders), else_=null())).scalar_subquery(),
            recount_until=select(case((s.tracked, recount_until), else_=null())).scalar_subquery(),
            rate_window=select(s.window_start).scalar_subquery(),
            rate_count=select(
                case((s.rate_left.is_(None), 0), else_=s.window_used + starts)
            ).scalar_subquery(),
        )
    )
    ctes = [noted.cte("noted")]
    if keyed:
        ctes.append(
            _note_key_starts(claimed, select(s.key_name).scalar_subquery(), rate).cte("noted_keys")
        )
    # One row at least: the room, with no job when the claim took none.
    return (
        select(
            room.c.room,
            room.c.wait,
            room.c.limited,
            room.c.keyed,
            key_wait.label("key_wait"),
            completed.label("completed"),
            settled.label("settled_batch"),
            *claimed.c,
        )
        .select_from(room.outerjoin(claimed, true()))
        .add_cte(*ctes)
    )


def _note_key_starts(claimed: CTE, key_name: ColumnElement[str], rate: _KeyRate) -> Insert:
    """Count the jobs a claim started against their keys' current window of the rate per key:
    an upsert per (task, key). A key whose row is in a later window already starts nothing in
    this claim (see :data:`KEY_STARTS_FUNCTION`); were it to, the row would keep that window,
    with these starts added, never going back to an earlier one."""
    key_rate, window = rate.limit, rate.window
    key = cast(claimed.c.payload, JSONB).op("->>")(key_name)
    counted = (
        select(
            bindparam("from_queue", type_=Text),
            claimed.c.task,
            key,
            window,
            cast(func.count(), Integer),
        )
        .where(claimed.c.status == RUNNING, key.is_not(None), key_rate.is_not(None))
        .group_by(claimed.c.task, key)
    )
    k = key_starts_table.c
    stmt = insert(key_starts_table).from_select(
        [k.queue, k.task, k.key, k.window_start, k.starts], counted
    )
    new = stmt.excluded
    return stmt.on_conflict_do_update(
        index_elements=[k.queue, k.task, k.key],
        set_={
            "window_start": func.greatest(k.window_start, new.window_start),
            "starts": case(
                (k.window_start >= new.window_start, k.starts + new.starts), else_=new.starts
            ),
        },
    )
