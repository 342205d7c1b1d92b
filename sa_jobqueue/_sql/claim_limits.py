"""The limited claim: the claim of a queue with a cap, a rate, or limits per key.

:func:`claim_limited` has four variants, one statement each: with or without limits per key
(``keyed``: see ``claim_keys``), and alone or completing, in the same statement, the jobs whose
slots it refills (``completing``: the worker's HandOff). They are built from the parts below,
each one CTE of the statement and named as in its SQL, in the order it runs:

``state``
    :func:`_locked_state`: the queue's settings row, locked, and its live holders.
``done``
    :func:`_complete_first` (``completing`` only): the completions whose slots are refilled.
``room``
    :func:`_room`: how many jobs this claim may start.
``head`` ... ``picked``
    ``claiming.pick_due``, or ``claim_keys.pick_keyed``: which due jobs, in claim order.
``claimed``
    ``claiming.start_picked``: the UPDATE that starts them, as the plain claim's does.
``noted``, ``noted_keys``
    :func:`_note_holders` and ``claim_keys.note_key_starts``: what the next claim will count.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import timedelta
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
    Text,
    Update,
    bindparam,
    case,
    cast,
    column,
    func,
    literal,
    null,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY

from ..models import RUNNING, jobs_table, queues_table
from . import transitions
from .claim_batches import outside_batch
from .claim_keys import KeyRate, note_key_starts, pick_keyed
from .claiming import pick_due, start_picked
from .dependencies import settle

#: The SQL function (revision sajq_0009) a limited claim starts with; see :func:`claim_limited`.
LOCK_FUNCTION: Final = "sa_jobqueue_lock_queue"

#: How long after a cap is set each limited claim of the queue recounts its running jobs from
#: the jobs table rather than trusting the recorded holders: longer than any claim takes, so a
#: claim that began before the cap was committed (and so took no slots) is counted once it has.
RECOUNT_FOR: Final = timedelta(seconds=2)

j = jobs_table.c
q = queues_table.c


def _locked_state() -> CTE:
    """The CTE ``state``: the queue's settings row, locked, with its live holders
    (:data:`LOCK_FUNCTION`'s row; none for a queue without a settings row).

    The lock makes the claims of a limited queue take turns: two at once would each count the
    same free slots and together overrun the cap. The function reads the row and the holders
    in a statement of its own, so with a snapshot taken after the lock was granted: this
    statement's snapshot, taken before the wait, would show the slots the claim it waited for
    took as still free.
    """
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


@dataclass(frozen=True)
class _Holding:
    """Who holds the queue's slots as the claim counts them, and what the completing variant
    adds to the statement (NULL and None without it)."""

    #: The live holders' ids, an array: the lock function's, less the jobs completed here.
    ids: ColumnElement[Any]
    #: The jobs the claim must not take (those completed here), or None.
    skip: ColumnElement[bool] | None = None
    #: The ids completed here, as the array ``completed`` of every row (None: NULL).
    completed: ColumnElement[Any] | None = None
    #: What settling the dependents of the jobs completed here returned (None: NULL).
    settled: ColumnElement[Any] | None = None


def _holders(state: CTE) -> _Holding:
    """The holders as the lock function read them (the variant without ``completing``)."""
    live_ids = state.c.live_ids
    return _Holding(cast(select(live_ids).scalar_subquery(), live_ids.type))


def _complete_first(state: CTE) -> _Holding:
    """The CTE ``done``: ``:job_ids`` completed at ``:attempt_list`` as
    ``transitions.complete_many`` does (fenced), their slots free for the claim that follows.

    The jobs completed here hold no slot, whether or not the lock function's snapshot saw them
    end; and none of them is claimed again by this statement (a job whose lease ran out is
    both claimable and completable: claimed, it would run again after it succeeded).
    """
    live_ids = state.c.live_ids
    # ``worker=`` as it is: the statement's ``:worker`` parameter would otherwise be taken for
    # a new value of this UPDATE's ``worker`` column too (a parameter named as a column).
    done = transitions.complete_many_update().values(worker=j.worker).cte("done")
    released = select(done.c.id).scalar_subquery()
    kept = select(func.unnest(live_ids).label("id")).except_(select(done.c.id))
    return _Holding(
        ids=cast(func.array(kept.scalar_subquery()), live_ids.type),
        skip=j.id == func.any(func.array(released)),
        completed=func.array(released),
        # The batch's dependents are settled with it, once (settle() is a scalar subquery).
        settled=settle(done),
    )


def _room(state: CTE, holding: _Holding, *, keyed: bool) -> CTE:
    """The CTE ``room``, one row: how many jobs the claim may start (``room``), the seconds
    until the queue's next rate window when the current one is used up (``wait``), whether the
    queue has a settings row (``limited``) and a limit per key (``keyed``).

    The room is ``:limit``, cut to the cap's free slots and to the rate window's starts left;
    0 for a paused queue, and for a queue with limits per key in the variant without
    ``keyed``, which cannot honour them; ``:limit`` for a queue without a settings row. The
    outer join of a one-row subquery gives the row even then: the worker reads ``limited``
    from it to learn that its list of limited queues is stale.
    """
    s = state.c
    limit = bindparam("limit", type_=Integer)
    fits = func.least(
        limit,
        func.coalesce(s.cap - func.cardinality(holding.ids), limit),
        func.coalesce(s.rate_left, limit),
    )
    # The variant without keys claims nothing from a queue that has a limit per key: the
    # worker read its limits before it was set, and asks again with the keyed variant.
    has_keys = s.key_name.is_not(None)
    held = s.is_paused if keyed else or_(s.is_paused, has_keys)
    one = select(literal(1).label("one")).subquery("one")
    return (
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


def _note_holders(state: CTE, holding: _Holding, claimed: CTE) -> Update:
    """The UPDATE (CTE ``noted``) of the queue's row that the next claim reads: its holders
    (those still live, and the jobs this claim started) and the rate window's count.

    Holders are kept only while the lock function says they are ``tracked`` (a cap is set);
    ``recount_until``, once set, stays: the claims until then count the queue's running jobs
    from the jobs table, which a claim that began before the cap was committed took no slot
    for (see :data:`RECOUNT_FOR`).
    """
    s = state.c
    started = select(claimed.c.id).where(claimed.c.status == RUNNING)
    starts = select(func.count()).select_from(started.subquery()).scalar_subquery()
    holders = func.array_cat(holding.ids, func.array(started.scalar_subquery()))
    recount_until = func.coalesce(q.recount_until, func.now() + RECOUNT_FOR)
    return (
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


def _or_null(value: ColumnElement[Any] | None) -> ColumnElement[Any]:
    return null() if value is None else value


@cache
def claim_limited(*, keyed: bool, completing: bool = False, batch: bool = False) -> Select[Any]:
    """Claim up to ``:limit`` jobs of the limited queue ``:from_queue``, within its limits.

    One statement in autocommit, like ``claiming.claim``. It starts with :data:`LOCK_FUNCTION`,
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
    reads the limits again, told by ``limited``). The rest is ``claiming.claim``'s scan and
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
    ``claiming.claim`` returns it; when the claim took none, one row with NULL job columns.
    Fewer jobs than the room: the queue had no more due; as many as the room, and the room
    below ``:limit``: the queue is at a limit.

    With ``completing``, the statement first completes ``:job_ids`` at ``:attempt_list`` as
    ``transitions.complete_many`` does (fenced), and the slots of those it completed are free
    for the claim that follows: one statement, and one durable commit, for a job's end and its
    successor's start (see the worker's ``HandOff``). The jobs it completed come back as the
    array ``completed`` on every row, and ``settled_batch`` is what settling their dependents
    returned (both NULL without ``completing``). A claimed job's columns follow, labelled as
    ``claiming.claim`` labels them: read them by label (``id`` is NULL in the row of a claim
    that took none).

    With ``batch``, only jobs of one batch are taken (see ``claim_batches.outside_batch``):
    the claim that fills a batch task's batch.
    """
    state = _locked_state()
    holding = _complete_first(state) if completing else _holders(state)
    if batch:
        holding = replace(holding, skip=outside_batch(holding.skip))
    room = _room(state, holding, keyed=keyed)
    room_left = select(room.c.room).scalar_subquery()
    key_wait: ColumnElement[Any] = null()
    if keyed:
        key_name = select(state.c.key_name).scalar_subquery()
        rate = KeyRate.read()
        picked, key_wait = pick_keyed(
            state, j.payload.op("->>")(key_name), room_left, holding.ids, holding.skip, rate
        )
    else:
        picked = pick_due(after=False, limit=room_left, unlimited_only=False, skip=holding.skip)
    # Matched by ``id = ANY (ARRAY(...))`` (``few``): the room is not a constant the planner
    # can see, and a join could read the whole jobs table (see ``claiming.start_picked``).
    claimed = start_picked(picked, few=True, durable=completing).cte("claimed")
    ctes = [_note_holders(state, holding, claimed).cte("noted")]
    if keyed:
        key_name = select(state.c.key_name).scalar_subquery()
        ctes.append(note_key_starts(claimed, key_name, rate).cte("noted_keys"))
    # One row at least: the room, with no job when the claim took none.
    return (
        select(
            room.c.room,
            room.c.wait,
            room.c.limited,
            room.c.keyed,
            key_wait.label("key_wait"),
            _or_null(holding.completed).label("completed"),
            _or_null(holding.settled).label("settled_batch"),
            *claimed.c,
        )
        .select_from(room.outerjoin(claimed, true()))
        .add_cte(*ctes)
    )
