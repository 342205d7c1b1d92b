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
from typing import Any, Final

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
from sqlalchemy.dialects.postgresql import Insert as PgInsert
from sqlalchemy.dialects.postgresql import insert as pg_insert

from .models import (
    CANCELLED,
    DEAD,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    claimable,
    jobs_table,
    periodic_table,
    prunable,
    unique_live,
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
def insert_job(
    schedule: str, wake: bool, unique: bool = False, traced: bool = False, backoff: bool = False
) -> Insert:
    """Insert one job; ``schedule`` is "now", "at" (a datetime) or "after" (a delay).

    ``:lease`` and ``:delay`` are seconds (see :func:`seconds`).

    With ``wake`` the same round trip also sends the queue's NOTIFY (see :func:`notify`); the
    NOTIFY is part of RETURNING, so it is sent only when the row is really inserted.

    With ``unique`` the row carries ``:unique_key`` and is not inserted (no row comes back)
    while a live job of the task holds that key; :func:`find_unique` then finds that job.

    With ``traced`` the row carries ``:trace_context`` (JSON text). Untraced enqueues keep the
    statement without it, so tracing switched off changes nothing, not even the SQL text.
    With ``backoff`` it carries ``:backoff``, the job's own retry policy (JSON text).
    """
    optional: dict[str, Any] = {}
    if unique:
        optional["unique_key"] = bindparam("unique_key", type_=Text)
    if traced:
        optional["trace_context"] = cast(bindparam("trace_context", type_=Text), JSONB)
    if backoff:
        optional["backoff"] = cast(bindparam("backoff", type_=Text), JSONB)
    stmt = pg_insert(jobs_table).values(
        queue=bindparam("queue"),
        task=bindparam("task"),
        payload=cast(bindparam("payload", type_=Text), JSONB),
        priority=bindparam("priority"),
        max_attempts=bindparam("max_attempts"),
        lease=seconds("lease"),
        visible_at=_visible_at(schedule),
        **optional,
    )
    if unique:
        stmt = _unless_key_is_live(stmt)
    return stmt.returning(j.id, func.pg_notify(CHANNEL, j.queue) if wake else literal(None))


def _unless_key_is_live(stmt: PgInsert) -> PgInsert:
    """``ON CONFLICT ... DO NOTHING`` against the unique index, named by its predicate.

    A plain INSERT would fail with a unique violation and abort the caller's transaction;
    DO NOTHING leaves it usable. A conflict with a row that another transaction has inserted
    but not committed waits for that transaction: if it rolls back, this row goes in.
    """
    return stmt.on_conflict_do_nothing(
        index_elements=[j.task, j.unique_key], index_where=unique_live()
    )


@cache
def insert_jobs(
    schedule: str, unique: bool = False, traced: bool = False, backoff: bool = False
) -> Insert:
    """Insert many jobs of one task in one statement, from an array of JSON texts.

    Parameters are those of :func:`insert_job` prefixed ``b_`` (``run_at`` and ``delay``
    excepted), plus ``payloads``. With ``unique``, also ``unique_keys`` (an array as long as
    ``payloads``, NULL for a job without a key): a row whose key a live job of the task holds
    is skipped, and each returned row says which key it carries: ``(id, unique_key)``. The
    keys of one batch must differ from each other. With ``traced``, every row carries the one
    ``:b_trace_context`` (JSON text): a batch is enqueued from one place in one trace.
    """
    arrays = [bindparam("payloads", type_=ARRAY(Text))]
    columns = [column("payload", Text)]
    if unique:
        arrays.append(bindparam("unique_keys", type_=ARRAY(Text)))
        columns.append(column("unique_key", Text))
    given = func.unnest(*arrays).table_valued(*columns).render_derived(name="p")
    # INSERT ... SELECT may not reuse a column's name for a bind parameter, hence "b_".
    rows = select(*_job_columns(cast(given.c.payload, JSONB), _visible_at(schedule))).select_from(
        given
    )
    names = list(_JOB_COLUMNS)
    if traced:
        rows = rows.add_columns(cast(bindparam("b_trace_context", type_=Text), JSONB))
        names.append("trace_context")
    if backoff:
        rows = rows.add_columns(cast(bindparam("b_backoff", type_=Text), JSONB))
        names.append("backoff")
    if unique:
        rows = rows.add_columns(given.c.unique_key)
        names.append("unique_key")
        stmt = _unless_key_is_live(pg_insert(jobs_table).from_select(names, rows))
        return stmt.returning(j.id, j.unique_key)
    return insert(jobs_table).from_select(names, rows).returning(j.id)


#: The columns of a new job that :func:`_job_columns` gives values for, in its order.
_JOB_COLUMNS: Final = (
    "queue",
    "task",
    "payload",
    "priority",
    "max_attempts",
    "lease",
    "visible_at",
)


def _job_columns(
    payload: ColumnElement[Any], visible_at: ColumnElement[datetime]
) -> tuple[ColumnElement[Any], ...]:
    """A new job's values from ``b_`` parameters, for ``INSERT ... SELECT``."""
    return (
        bindparam("b_queue", type_=Text),
        bindparam("b_task", type_=Text),
        payload,
        bindparam("b_priority", type_=Integer),
        bindparam("b_max_attempts", type_=Integer),
        seconds("b_lease"),
        visible_at,
    )


@cache
def find_unique() -> Select[str, int]:
    """The live jobs of ``:task`` that hold one of ``:unique_keys``: ``(unique_key, id)``.

    Run after an insert of :func:`insert_job` or :func:`insert_jobs` skipped a row, as a
    statement of its own: under READ COMMITTED it then sees a conflicting row that a
    concurrent transaction committed while the insert waited for it. It may also find nothing,
    if that job finished in between: the caller inserts again.
    """
    return select(j.unique_key, j.id).where(
        j.task == bindparam("task", type_=Text),
        j.unique_key == any_(bindparam("unique_keys", type_=ARRAY(Text))),
        unique_live(),
    )


# -- periodic schedules ----------------------------------------------------------------------

pc = periodic_table.c


@cache
def database_now() -> Select[datetime]:
    """The database's clock: the start of the current transaction."""
    return select(func.now())


@cache
def last_ticks() -> Select[str, datetime]:
    """The stored ``(name, last_tick)`` of the schedules named in ``:names``."""
    return select(pc.name, pc.last_tick).where(
        pc.name == any_(bindparam("names", type_=ARRAY(Text)))
    )


@cache
def add_schedules() -> Insert:
    """Record new schedules ``:names`` with ``last_tick = :now``; existing ones are untouched.

    DO NOTHING: of several processes that see a schedule for the first time, one inserts its
    row and the others keep what it stored, so nobody's clock rewinds a schedule.
    """
    names = (
        func.unnest(bindparam("names", type_=ARRAY(Text)))
        .table_valued(column("name", Text))
        .render_derived(name="n")
    )
    rows = select(names.c.name, bindparam("now", type_=DateTime(timezone=True))).select_from(names)
    return (
        pg_insert(periodic_table)
        .from_select(["name", "last_tick"], rows)
        .on_conflict_do_nothing(index_elements=[pc.name])
    )


@cache
def enqueue_tick(unique: bool) -> Insert:
    """Move schedule ``:schedule`` forward to ``:tick`` and insert its job, in one statement.

    The move is a compare-and-set, ``last_tick < :tick``: of many processes that find the same
    tick due, the first moves the row and inserts the job; the others wait for its row lock,
    then see the new ``last_tick``, move nothing and (the INSERT reads the UPDATE's RETURNING)
    insert nothing. A process with an older tick can never move the schedule back. Being one
    statement, it is atomic even on an autocommit connection (the worker's). Returns the job's
    ``(id, pg_notify)``, or no row.

    Job parameters are those of :func:`insert_jobs` (``b_`` prefixed) plus ``b_payload``;
    with ``unique`` also ``b_unique_key``: a tick whose key a live job of the task holds moves
    the schedule but inserts no job, so the tick is skipped rather than queued behind it.
    """
    tick = bindparam("tick", type_=DateTime(timezone=True))
    # A data-modifying CTE must sit at the top of the statement, hence add_cte() on the INSERT.
    moved = (
        update(periodic_table)
        .where(pc.name == bindparam("schedule", type_=Text), pc.last_tick < tick)
        .values(last_tick=tick)
        .returning(pc.name)
        .cte("moved")
    )
    rows = select(
        *_job_columns(cast(bindparam("b_payload", type_=Text), JSONB), func.now())
    ).select_from(moved)
    names = list(_JOB_COLUMNS)
    if unique:
        rows = rows.add_columns(bindparam("b_unique_key", type_=Text))
        names.append("unique_key")
    stmt = pg_insert(jobs_table).from_select(names, rows).add_cte(moved)
    if unique:
        stmt = _unless_key_is_live(stmt)
    return stmt.returning(j.id, func.pg_notify(CHANNEL, j.queue))


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
            j.trace_context,
            j.backoff,
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
def snooze() -> Update:
    """Put a running attempt's job back in the queue ``:delay`` seconds on, with no error.

    What a handler's ``Retry`` does. The attempt stays counted (attempts are counted when
    claimed), so that ``attempts`` still names one attempt for the fence; ``max_attempts``
    grows by one when none would be left, so a job cannot run out of attempts by retrying.
    A job whose cancellation was requested ends ``cancelled`` instead. Returns the new status
    and due time, or no row if stale.
    """
    cancelled = j.cancel_requested
    return _fenced(
        update(jobs_table)
        .values(
            status=case((cancelled, CANCELLED), else_=QUEUED),
            visible_at=func.now() + seconds("delay"),
            finished_at=case((cancelled, func.now()), else_=None),
            max_attempts=func.greatest(j.max_attempts, j.attempts + 1),
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
