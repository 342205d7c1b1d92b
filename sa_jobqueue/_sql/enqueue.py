"""Inserting jobs: one, or many by one INSERT, unique or not, and the wake-up sent with them.

Unique jobs take up to three statements, each a plain one: the insert (``ON CONFLICT DO
NOTHING``), then for the replace and debounce modes :func:`.unique_holders.update_held` (a
guarded UPDATE of a queued holder), then :func:`.unique_holders.find_unique` (the holder that
was left as it was). Many jobs by COPY take the statements of :mod:`.copying`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from functools import cache
from typing import Any, Final

from sqlalchemy import (
    ARRAY,
    BigInteger,
    ColumnElement,
    DateTime,
    Float,
    Insert,
    Integer,
    Select,
    Text,
    bindparam,
    case,
    cast,
    column,
    extract,
    func,
    insert,
    literal_column,
    null,
    select,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import Insert as PgInsert
from sqlalchemy.dialects.postgresql import insert as pg_insert

from ..models import (
    jobs_table,
    unique_live,
)
from .clock import seconds

#: The one NOTIFY channel. Never derived from user data: the payload carries the queue name.
CHANNEL: Final = "sa_jobqueue"

j = jobs_table.c


def due_at(
    schedule: str, interval: Callable[[str], ColumnElement[timedelta]] = seconds
) -> ColumnElement[datetime]:
    """When a new job becomes due: now, at ``:run_at``, or ``:delay`` seconds after now (an
    ``interval`` of that parameter)."""
    if schedule == "at":
        return bindparam("run_at", type_=DateTime(timezone=True))
    if schedule == "after":
        return func.now() + interval("delay")
    return func.now()


def seconds_written(param: str) -> ColumnElement[timedelta]:
    """:func:`seconds`, the interval of ``:param`` seconds, with its constant zeros in the text.

    For the one-job INSERT, the statement every ``enqueue`` sends: each parameter costs the
    client a conversion per call (six zeros cost the driver as much as the job's own values),
    and a constant written in the text costs nothing. Same function, same interval.
    """
    zero = literal_column("0", Integer)
    return func.make_interval(zero, zero, zero, zero, zero, zero, bindparam(param, type_=Float))


def unique_window(param: str) -> ColumnElement[datetime]:
    """The start of the fixed window of ``:param`` seconds that ``now()`` falls in.

    Windows are cut from the Unix epoch: an hour's start on the hour, a day's at midnight UTC.
    ``extract`` gives an exact numeric, and the period is a whole number of seconds, so every
    transaction that began in the same window computes the very same start.
    """
    period = bindparam(param, type_=Integer)
    return func.to_timestamp(
        func.floor(extract("epoch", func.now()) / period) * period,
        type_=DateTime(timezone=True),
    )


@cache
def insert_job(
    schedule: str,
    wake: bool,
    unique: bool = False,
    traced: bool = False,
    backoff: bool = False,
    period: bool = False,
    labels: bool = False,
) -> Insert:
    """Insert one job; ``schedule`` is "now", "at" (a datetime) or "after" (a delay).

    ``:lease`` and ``:delay`` are seconds (see :func:`seconds_written`); the statement binds
    no constants of its own.

    With ``wake`` the same round trip also sends the queue's NOTIFY (see :func:`notify`); the
    NOTIFY is part of RETURNING, so it is sent only when the row is really inserted.

    With ``unique`` the row carries ``:unique_key`` and is not inserted (no row comes back)
    while a live job of the task holds that key; :func:`find_unique` then finds that job.

    With ``period`` (and ``unique``) the row also carries its window (see :func:`unique_window`,
    ``:unique_period`` seconds), and is not inserted either while a job of the task with that
    key exists in that window, finished or not.

    With ``traced`` the row carries ``:trace_context`` (JSON text). Untraced enqueues keep the
    statement without it, so tracing switched off changes nothing, not even the SQL text.
    With ``backoff`` it carries ``:backoff``, the job's own retry policy (JSON text); with
    ``labels``, ``:tags`` (an array), ``:meta`` and ``:on_error`` (JSON text), any of them
    NULL. A job without tags, meta or error callbacks is sent without them: the common
    enqueue's statement is unchanged.
    """
    optional: dict[str, Any] = {}
    if unique:
        optional["unique_key"] = bindparam("unique_key", type_=Text)
    if unique and period:
        optional["unique_window"] = unique_window("unique_period")
    if traced:
        optional["trace_context"] = cast(bindparam("trace_context", type_=Text), JSONB)
    if backoff:
        optional["backoff"] = cast(bindparam("backoff", type_=Text), JSONB)
    if labels:
        optional["tags"] = bindparam("tags", type_=ARRAY(Text))
        optional["meta"] = cast(bindparam("meta", type_=Text), JSONB)
        optional["on_error"] = cast(bindparam("on_error", type_=Text), JSONB)
    stmt = pg_insert(jobs_table).values(
        queue=bindparam("queue"),
        task=bindparam("task"),
        payload=cast(bindparam("payload", type_=Text), JSONB),
        priority=bindparam("priority"),
        max_attempts=bindparam("max_attempts"),
        lease=seconds_written("lease"),
        visible_at=due_at(schedule, seconds_written),
        **optional,
    )
    if unique:
        stmt = unless_key_is_held(stmt, period)
    # No parameter but the job's values (see seconds_written): the channel is written in the
    # text (a constant of ours, never user data), and so is the NULL of a job that wakes none.
    channel = literal_column(f"'{CHANNEL}'", Text)
    return stmt.returning(j.id, func.pg_notify(channel, j.queue) if wake else null())


def unless_key_is_held(stmt: PgInsert, period: bool) -> PgInsert:
    """:func:`unless_key_is_live`, or with ``period`` against both unique indexes.

    ``ON CONFLICT`` names one arbiter index or none; a row with a window may conflict with the
    live index or with the window index, so that statement names none and does nothing on
    either (the id is drawn from the sequence, so the primary key never conflicts).
    """
    return stmt.on_conflict_do_nothing() if period else unless_key_is_live(stmt)


def unless_key_is_live(stmt: PgInsert) -> PgInsert:
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
    schedule: str,
    unique: bool = False,
    traced: bool = False,
    backoff: bool = False,
    wake: bool = False,
    period: bool = False,
    labels: bool = False,
    workflow: bool = False,
) -> Insert:
    """Insert many jobs of one task in one statement, from an array of JSON texts.

    Parameters are those of :func:`insert_job` prefixed ``b_`` (``run_at`` and ``delay``
    excepted), plus ``payloads``. With ``unique``, also ``unique_keys`` (an array as long as
    ``payloads``, NULL for a job without a key): a row whose key a live job of the task holds
    is skipped, and each returned row says which key it carries: ``(id, unique_key)``. The
    keys of one batch must differ from each other. With ``traced``, every row carries the one
    ``:b_trace_context`` (JSON text): a batch is enqueued from one place in one trace.

    With ``wake`` the same round trip also sends ``:b_queue``'s NOTIFY, once, and only if a
    row is inserted: see :func:`wake_once`. With ``period`` (and ``unique``), each row with a
    key also carries its window of ``:b_unique_period`` seconds, as in :func:`insert_job`.
    With ``labels``, every row carries the one ``:b_tags`` and ``:b_meta`` (an enqueue gives
    all its jobs the same).
    With ``workflow`` every row carries ``:b_workflow_id`` and ``:b_workflow_step`` (a step's
    name, or NULL): the jobs of one call of a chain, group, chord or DAG.
    """
    arrays = [bindparam("payloads", type_=ARRAY(Text))]
    columns = [column("payload", Text)]
    if unique:
        arrays.append(bindparam("unique_keys", type_=ARRAY(Text)))
        columns.append(column("unique_key", Text))
    given = func.unnest(*arrays).table_valued(*columns).render_derived(name="p")
    # INSERT ... SELECT may not reuse a column's name for a bind parameter, hence "b_".
    rows = select(*job_columns(cast(given.c.payload, JSONB), due_at(schedule))).select_from(given)
    names = list(JOB_COLUMNS)
    if traced:
        rows = rows.add_columns(cast(bindparam("b_trace_context", type_=Text), JSONB))
        names.append("trace_context")
    if backoff:
        rows = rows.add_columns(cast(bindparam("b_backoff", type_=Text), JSONB))
        names.append("backoff")
    if labels:
        rows = rows.add_columns(*labels_given())
        names += LABEL_COLUMNS
    if workflow:
        rows = rows.add_columns(
            bindparam("b_workflow_id", type_=BigInteger), bindparam("b_workflow_step", type_=Text)
        )
        names += ["workflow_id", "workflow_step"]
    woken = (wake_once(bindparam("b_queue", type_=Text)),) if wake else ()
    if unique:
        rows = rows.add_columns(given.c.unique_key)
        names.append("unique_key")
        if period:
            # Keyless rows of the batch have no window: nothing is unique about them.
            window = case(
                (given.c.unique_key.is_not(None), unique_window("b_unique_period")), else_=null()
            )
            rows = rows.add_columns(window)
            names.append("unique_window")
        stmt = unless_key_is_held(pg_insert(jobs_table).from_select(names, rows), period)
        return stmt.returning(j.id, j.unique_key, *woken)
    return insert(jobs_table).from_select(names, rows).returning(j.id, *woken)


def wake_once(queue: ColumnElement[str]) -> ColumnElement[Any]:
    """``(SELECT pg_notify(...))`` for a RETURNING list: one NOTIFY per statement, if any row.

    An uncorrelated scalar subquery is an InitPlan: PostgreSQL runs it once, the first time a
    row needs it, and never when no row comes back. So a batch sends one notification (not one
    per row), and an insert that skipped every row (unique keys all held) sends none.
    """
    return select(func.pg_notify(CHANNEL, queue)).scalar_subquery()


#: The columns :func:`labels_given` gives values for, in its order.
LABEL_COLUMNS: Final = ("tags", "meta", "on_error")


def labels_given() -> tuple[ColumnElement[Any], ...]:
    """A new job's ``tags``, ``meta`` and ``on_error`` from ``:b_tags`` (an array),
    ``:b_meta`` and ``:b_on_error`` (JSON text), for ``INSERT ... SELECT``."""
    return (
        bindparam("b_tags", type_=ARRAY(Text)),
        cast(bindparam("b_meta", type_=Text), JSONB),
        cast(bindparam("b_on_error", type_=Text), JSONB),
    )


#: The columns of a new job that :func:`job_columns` gives values for, in its order.
JOB_COLUMNS: Final = (
    "queue",
    "task",
    "payload",
    "priority",
    "max_attempts",
    "lease",
    "visible_at",
)


def job_columns(
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
def notify() -> Select[object]:
    """Wake idle workers of ``:queue``. Delivered at commit, dropped on rollback.

    PostgreSQL folds identical notifications of one transaction into one; the enqueue side also
    sends at most one per queue per transaction, so bulk and repeated enqueues cost one each.
    """
    return select(func.pg_notify(CHANNEL, bindparam("queue", type_=Text)))
