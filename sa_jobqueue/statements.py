"""Every SQL statement sa_jobqueue runs, built with SQLAlchemy Core in one reviewable place.

Each function returns a statement with named bind parameters; callers execute it with values.
Nothing here does I/O. Rules that hold for all of them:

* Time comes from the database (``now()``); Python passes durations only. Workers' clocks
  may be wrong, and two workers' clocks always disagree a little.
* Every transition of a running job is fenced: ``WHERE id = :job_id AND status = 'running' AND
  attempts = :attempt``. ``attempts`` is counted at claim time, so it names one attempt; a
  worker whose lease expired (and whose job was reclaimed, making ``attempts`` larger) matches
  zero rows and must roll back instead of overwriting the newer attempt's outcome.
* Queue and task names are always bound parameters, never spliced into SQL text.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import cache
from typing import Final

from sqlalchemy import (
    ARRAY,
    BigInteger,
    ColumnElement,
    DateTime,
    Delete,
    Float,
    Insert,
    Integer,
    Select,
    TableValuedAlias,
    Text,
    Update,
    and_,
    any_,
    bindparam,
    case,
    cast,
    column,
    delete,
    func,
    insert,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB

from .models import (
    CANCELLED,
    DEAD,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    claimable,
    jobs_table,
    prunable,
)

#: The one NOTIFY channel. Never derived from user data: the payload carries the queue name.
CHANNEL: Final = "sa_jobqueue"
#: What the claim records when it takes a job back from a worker that stopped renewing it.
LEASE_EXPIRED: Final = "lease expired (worker lost)"

j = jobs_table.c


def seconds(param: str) -> ColumnElement[timedelta]:
    """An interval from a bind parameter holding a number of seconds.

    Durations travel as seconds, not as Python timedeltas: psycopg sends ``timedelta(days=n)``
    as an interval of n calendar days, and ``now() + '1 day'`` across a daylight-saving change
    in the session's time zone is 23 or 25 hours, not 24.
    """
    return func.make_interval(0, 0, 0, 0, 0, 0, bindparam(param, type_=Float))


def _visible_at(schedule: str) -> ColumnElement[datetime]:
    """When a new job becomes due: now, at ``:run_at``, or ``:delay`` seconds after now."""
    if schedule == "at":
        return bindparam("run_at", type_=DateTime(timezone=True))
    if schedule == "after":
        return func.now() + seconds("delay")
    return func.now()


@cache
def insert_job(schedule: str, wake: bool) -> Insert:
    """Insert one job; ``schedule`` is "now", "at" (a datetime) or "after" (a delay).

    ``:lease`` and ``:delay`` are seconds (see :func:`seconds`).

    With ``wake`` the same round trip also sends the queue's NOTIFY (see :func:`notify`).
    """
    return (
        insert(jobs_table)
        .values(
            queue=bindparam("queue"),
            task=bindparam("task"),
            payload=cast(bindparam("payload", type_=Text), JSONB),
            priority=bindparam("priority"),
            max_attempts=bindparam("max_attempts"),
            lease=seconds("lease"),
            visible_at=_visible_at(schedule),
        )
        .returning(j.id, func.pg_notify(CHANNEL, j.queue) if wake else literal(None))
    )


@cache
def insert_jobs(schedule: str) -> Insert:
    """Insert many jobs of one task in one statement, from an array of JSON texts.

    Parameters are those of :func:`insert_job` prefixed ``b_`` (``run_at`` and ``delay``
    excepted), plus ``payloads``.
    """
    payloads = (
        func.unnest(bindparam("payloads", type_=ARRAY(Text)))
        .table_valued(column("payload", Text))
        .render_derived(name="p")
    )
    # INSERT ... SELECT may not reuse a column's name for a bind parameter, hence "b_".
    rows = select(
        bindparam("b_queue", type_=Text),
        bindparam("b_task", type_=Text),
        cast(payloads.c.payload, JSONB),
        bindparam("b_priority", type_=Integer),
        bindparam("b_max_attempts", type_=Integer),
        seconds("b_lease"),
        _visible_at(schedule),
    ).select_from(payloads)
    return (
        insert(jobs_table)
        .from_select(
            ["queue", "task", "payload", "priority", "max_attempts", "lease", "visible_at"], rows
        )
        .returning(j.id)
    )


@cache
def notify() -> Select[object]:
    """Wake idle workers of ``:queue``. Delivered at commit, dropped on rollback.

    PostgreSQL folds identical notifications of one transaction into one; the enqueue side also
    sends at most one per queue per transaction, so bulk and repeated enqueues cost one each.
    """
    return select(func.pg_notify(CHANNEL, bindparam("queue", type_=Text)))


@cache
def claim() -> Update:
    """Claim up to ``:limit`` jobs from ``:from_queue`` for ``:worker``, in one statement.

    Eligible rows are queued jobs whose time has come and running jobs whose lease has expired
    (their worker died or stalled): reclaim rides in the claim, so no reaper process is needed
    and a lost job is picked up by whoever polls next. A reclaimed job with no attempts left
    is not run again but moved to ``dead``, and one whose cancellation was requested is moved
    to ``cancelled``; the caller skips rows that come back in a finished state.
    """
    # The SELECT ... FOR UPDATE SKIP LOCKED sits in a MATERIALIZED CTE and the UPDATE joins it.
    # Written as ``WHERE id IN (SELECT ... LIMIT ... FOR UPDATE)`` the planner may run the
    # subquery more than once and lock (and update) more rows than LIMIT; the fence makes it
    # run exactly once. One queue per claim keeps the scan in index order (an ``= ANY(array)``
    # on the leading column would return rows unordered and force a sort of the backlog).
    # ``claimable()`` repeats the partial index's predicate word for word so
    # the planner can use that index even for a generic (prepared) plan.
    picked = (
        select(j.id)
        .where(
            claimable(),
            j.queue == bindparam("from_queue", type_=Text),
            j.visible_at <= func.now(),
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
        )
    )


def _fenced(stmt: Update) -> Update:
    return stmt.where(
        j.id == bindparam("job_id", type_=BigInteger),
        j.status == RUNNING,
        j.attempts == bindparam("attempt", type_=Integer),
    )


@cache
def complete() -> Update:
    """Mark one attempt succeeded; zero rows means it is stale or its job is being cancelled.

    A job whose cancellation was requested while it ran does not complete: its handler's
    writes roll back and :func:`finish_cancelled` ends it instead.
    """
    return _fenced(
        update(jobs_table)
        .where(j.cancel_requested.is_(False))
        # statement_timestamp(), not now(): this runs in the handler's transaction, whose
        # now() is the moment the handler first touched the database.
        .values(
            status=SUCCEEDED,
            finished_at=func.statement_timestamp(),
            visible_at=func.statement_timestamp(),
        )
    )


def _held_ids() -> ColumnElement[bool]:
    """``id = ANY(:job_ids)``, said once more beside the join on :func:`_held`.

    Redundant for the result, but it is what makes the planner find the rows through the
    primary key. Joined on ``unnest`` alone, whose size it cannot see, it may instead walk the
    claim index for every ``status = 'running'`` row, which, with statistics taken while the
    backlog was all queued, it believes to be one row; on a backlog of thousands that made
    every batched completion scan the backlog.
    """
    return j.id == any_(bindparam("job_ids", type_=ARRAY(BigInteger)))


def _fenced_many(held: TableValuedAlias) -> tuple[ColumnElement[bool], ...]:
    """The fence of :func:`_fenced`, row by row against :func:`_held`."""
    return (_held_ids(), j.id == held.c.id, j.attempts == held.c.attempt, j.status == RUNNING)


def _held() -> TableValuedAlias:
    """``unnest(:job_ids, :attempt_list)`` as rows of (id, attempt): many fences at once."""
    return (
        func.unnest(
            bindparam("job_ids", type_=ARRAY(BigInteger)),
            bindparam("attempt_list", type_=ARRAY(Integer)),
        )
        .table_valued(column("id", BigInteger), column("attempt", Integer))
        .render_derived(name="held")
    )


@cache
def complete_many() -> Update:
    """:func:`complete` for many attempts in one statement; returns the ids it completed."""
    held = _held()
    return (
        update(jobs_table)
        .where(
            *_fenced_many(held),
            j.cancel_requested.is_(False),
        )
        .values(
            status=SUCCEEDED,
            finished_at=func.statement_timestamp(),
            visible_at=func.statement_timestamp(),
        )
        .returning(j.id)
    )


@cache
def release() -> Update:
    """Hand claimed attempts that never started back to the queue, as if never claimed.

    Used on shutdown for jobs still waiting in the worker's buffer: the attempt is not counted
    and the job is due again at once. Fenced like every transition.
    """
    held = _held()
    return (
        update(jobs_table)
        .where(*_fenced_many(held))
        .values(
            # A job cancelled while it waited in the buffer ends here rather than run again.
            status=case((j.cancel_requested, CANCELLED), else_=QUEUED),
            attempts=j.attempts - 1,
            visible_at=func.now(),
            started_at=None,
            finished_at=case((j.cancel_requested, func.now()), else_=None),
            worker=None,
        )
        .returning(j.id)
    )


@cache
def finish_cancelled() -> Update:
    """End one attempt whose job's cancellation was requested as ``cancelled``."""
    return _fenced(
        update(jobs_table)
        .where(j.cancel_requested.is_(True))
        .values(status=CANCELLED, finished_at=func.now(), worker=None)
    )


@cache
def cancel_queued() -> Update:
    """Cancel ``:job_id`` if it is still waiting; it will never run."""
    return (
        update(jobs_table)
        .where(j.id == bindparam("job_id", type_=BigInteger), j.status == QUEUED)
        .values(status=CANCELLED, finished_at=func.now())
        .returning(j.id)
    )


@cache
def request_cancel() -> Update:
    """Ask the worker running ``:job_id`` to stop it; it ends ``cancelled``, not retried."""
    return (
        update(jobs_table)
        .where(j.id == bindparam("job_id", type_=BigInteger), j.status == RUNNING)
        .values(cancel_requested=True)
        .returning(j.id)
    )


@cache
def fail() -> Update:
    """Record a failed attempt: ``queued`` again ``:delay`` seconds on, or ``dead`` if exhausted.

    A job whose cancellation was requested ends ``cancelled`` instead of being retried.

    ``:error`` is the error as JSON text. Returns the new status, or no row if stale.
    """
    exhausted = or_(j.attempts >= j.max_attempts, j.cancel_requested)
    return _fenced(
        update(jobs_table)
        .values(
            status=case((j.cancel_requested, CANCELLED), (exhausted, DEAD), else_=QUEUED),
            visible_at=func.now() + seconds("delay"),
            finished_at=case((exhausted, func.now()), else_=None),
            last_error=cast(bindparam("error", type_=Text), JSONB),
            worker=None,
        )
        .returning(j.status, j.visible_at)
    )


@cache
def bury() -> Update:
    """Move one attempt's job straight to ``dead`` (unknown task, undecodable job)."""
    return _fenced(
        update(jobs_table)
        .values(
            status=DEAD,
            finished_at=func.now(),
            last_error=cast(bindparam("error", type_=Text), JSONB),
            worker=None,
        )
        .returning(j.status)
    )


@cache
def extend_leases() -> Update:
    """Renew the leases of many running attempts at once (the worker's heartbeat).

    Fenced per row like every transition: an attempt that was already reclaimed is not
    renewed, and its id is missing from the returned rows. Each returned row also says
    whether the job's cancellation has been requested. A row locked by another transaction
    is skipped rather than waited for, and is missing too: :func:`still_held` tells the two
    apart.
    """
    # Without SKIP LOCKED the heartbeat would wait for the lock of any transaction holding a
    # running job's row: the worker's own group of completed jobs that has yet to commit, or
    # an application transaction that requested a cancellation and has not committed. While
    # it waited, no lease of this worker would be renewed and no timeout enforced.
    held = _held()
    renewable = (
        select(j.id)
        .where(*_fenced_many(held))
        .with_for_update(of=jobs_table, skip_locked=True)
        .cte("renewable")
        .prefix_with("MATERIALIZED")
    )
    return (
        update(jobs_table)
        .where(j.id == renewable.c.id)
        .values(visible_at=func.now() + j.lease)
        .returning(j.id, j.cancel_requested)
    )


@cache
def still_held() -> Select[int]:
    """Which of these attempts are still running (a plain read: it waits for no lock)."""
    held = _held()
    return select(j.id).where(*_fenced_many(held))


#: The advisory lock that lets one worker at a time prune (an arbitrary constant: "sajq").
PRUNE_LOCK: Final = 0x736A_7170


@cache
def try_prune_lock() -> Select[bool]:
    """Take the prune lock for this transaction, if no other session holds it."""
    return select(func.pg_try_advisory_xact_lock(literal(PRUNE_LOCK, type_=BigInteger)))


@cache
def prune() -> Delete:
    """Delete up to ``:limit`` succeeded or cancelled jobs finished ``:retention`` seconds ago.

    Dead jobs are never pruned: they wait to be requeued or purged. Bounded, so one call holds
    its locks for a short while; the oldest go first; rows locked by someone else are skipped.
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
    return delete(jobs_table).where(j.id == doomed.c.id)


@cache
def counts() -> Select[str, str, int]:
    """Jobs per queue and status."""
    return (
        select(j.queue, j.status, func.count())
        .group_by(j.queue, j.status)
        .order_by(j.queue, j.status)
    )
