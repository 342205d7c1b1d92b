"""Operating the queue: job operations, statistics, purging history, and the worker registry.

The statement builders come first: pure functions returning SQLAlchemy Core statements, no I/O.
The functions below them take a :class:`~sqlalchemy.Connection` and run those statements. Every
figure is computed by the database against its own ``now()``; Python passes durations only.
The health checks built on these live in :mod:`sa_jobqueue.health`.

None of this is needed to run jobs. ``stats`` only reads, in the connection's current
transaction, and commits nothing. ``purge`` commits each of its batches itself. The
worker-registry functions run in the connection's transaction (a worker's control engine is in
autocommit, so there each is its own transaction).

What is not promised: the figures are a snapshot, not a consistent accounting (counts and
ages come from separate statements).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from typing import Any, Final

from sqlalchemy import (
    ARRAY,
    BigInteger,
    ColumnElement,
    Connection,
    Integer,
    Interval,
    Select,
    Text,
    Update,
    and_,
    any_,
    bindparam,
    cast,
    delete,
    exists,
    func,
    literal,
    select,
    type_coerce,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.dml import Insert, ReturningDelete

from .._sql.admin import counts
from .._sql.clock import seconds
from .._validation import MAX_ATTEMPTS, check_queue_name, check_task_name
from ..errors import InvalidJobError
from ..models import (
    DEAD,
    FINISHED_STATUSES,
    QUEUED,
    RUNNING,
    STATUSES,
    SUCCEEDED,
    claimable,
    jobs_table,
    workers_table,
)

j = jobs_table.c
w = workers_table.c

#: The most rows one call of :meth:`JobQueue.list_jobs` returns, and the largest purge batch.
MAX_PAGE: Final = 10_000


# -- statement builders: job operations ------------------------------------------------------


@cache
def requeue_dead(reset: bool) -> Update:
    """Move dead job ``:job_id`` back to ``queued``, due now; returns its queue, or no row.

    Compare-and-set on ``status = 'dead'``: a job that is anything else is left alone. With
    ``reset`` its attempts start again from 0; otherwise ``attempts`` is kept and
    ``max_attempts`` raised by its current value (see :meth:`JobQueue.requeue`).
    ``last_error`` is kept, so the next attempt's handler and the operator can still see why
    it died.
    """
    live = jobs_table.alias("live")
    # A dead job's unique key is free for a new job of the same task; if one now holds it,
    # requeueing would break the unique index, and the error would abort the caller's
    # transaction. Not requeueing (no row) leaves it usable. A concurrent enqueue of the same
    # key can still win the race, and then the unique violation does propagate.
    key_taken = exists().where(
        live.c.task == j.task,
        live.c.unique_key == j.unique_key,
        live.c.status.in_((QUEUED, RUNNING)),
    )
    stmt = update(jobs_table).where(
        j.id == bindparam("job_id", type_=BigInteger), j.status == DEAD, ~key_taken
    )
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
    ).returning(j.queue)


@cache
def select_jobs(
    columns: tuple[str, ...],
    *,
    statuses: bool,
    queue: bool,
    task: bool,
    older_than: bool,
    after: bool,
    newest_first: bool = False,
) -> Select[Any]:
    """Up to ``:limit`` jobs in id order, filtered by the parameters that are switched on.

    ``:statuses`` (an array), ``:queue``, ``:task``, ``:older_than`` (seconds since
    ``created_at``) and ``:after_id`` (keyset pagination: the last id of the previous page).
    ``newest_first`` reverses the order, and with it the keyset: "after" is then a lower id,
    so a page never repeats or skips a row of the previous one. One statement per
    combination of filters, each with stable text.
    """
    conditions: list[ColumnElement[bool]] = []
    if statuses:
        conditions.append(j.status == any_(bindparam("statuses", type_=ARRAY(Text))))
    if queue:
        conditions.append(j.queue == bindparam("queue", type_=Text))
    if task:
        conditions.append(j.task == bindparam("task", type_=Text))
    if older_than:
        conditions.append(j.created_at < func.now() - seconds("older_than"))
    if after:
        after_id = bindparam("after_id", type_=BigInteger)
        conditions.append(j.id < after_id if newest_first else j.id > after_id)
    return (
        select(*(j[c] for c in columns))
        .where(*conditions)
        .order_by(j.id.desc() if newest_first else j.id)  # the primary key, read either way
        .limit(bindparam("limit", type_=Integer))
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


# -- statement builders: statistics ---------------------------------------------------------


def elapsed(moment: ColumnElement[datetime]) -> ColumnElement[timedelta]:
    """``now() - moment``, typed as the interval it is."""
    return type_coerce(func.now() - moment, Interval)


@cache
def due_per_queue() -> Select[str, int, timedelta]:
    """Per queue: queued jobs that are due, and how long the oldest of them has waited."""
    # claimable() repeats the claim index's predicate, so the scan uses that index and never
    # reads finished history.
    return (
        select(j.queue, func.count(), elapsed(func.min(j.visible_at)))
        .where(claimable(), j.status == QUEUED, j.visible_at <= func.now())
        .group_by(j.queue)
        .order_by(j.queue)
    )


@cache
def live_per_queue() -> Select[str, int, int, int, timedelta | None]:
    """Per queue: queued, due and running jobs, and how long the oldest due job has waited.

    For metrics scraped every few seconds: it reads only the rows in the claim index (queued
    and running), never the finished history, so its cost follows the backlog, not the table.
    """
    queued = j.status == QUEUED
    due = and_(queued, j.visible_at <= func.now())
    return (
        select(
            j.queue,
            func.count().filter(queued),
            func.count().filter(due),
            func.count().filter(j.status == RUNNING),
            elapsed(func.min(j.visible_at).filter(due)),
        )
        .where(claimable())
        .group_by(j.queue)
        .order_by(j.queue)
    )


@cache
def local_statement_timeout() -> Select[str]:
    """``SET LOCAL statement_timeout`` to ``:timeout_ms``: for the rest of this transaction."""
    # set_config() rather than SET LOCAL, which takes no bind parameters.
    return select(
        func.set_config(literal("statement_timeout"), bindparam("timeout_ms", type_=Text), True)
    )


@cache
def finished_per_queue() -> Select[str, str, int]:
    """Per queue and finished status: jobs that finished in the last ``:window`` seconds."""
    return (
        select(j.queue, j.status, func.count())
        .where(
            j.status == any_(literal(list(FINISHED_STATUSES), ARRAY(Text))),
            j.finished_at >= func.now() - seconds("window"),
        )
        .group_by(j.queue, j.status)
        .order_by(j.queue, j.status)
    )


@cache
def run_times() -> Select[str, int, timedelta, timedelta]:
    """Per task: jobs finished in the last ``:window`` seconds, and their p50 and p99 run time.

    The run time is ``finished_at - started_at`` of the job's last attempt (started at its
    claim, so time spent in the worker's buffer counts too). Succeeded and dead jobs only:
    a job cancelled while queued never ran.
    """
    run = j.finished_at - j.started_at
    return (
        select(
            j.task,
            func.count(),
            func.percentile_cont(0.5).within_group(run).cast(Interval),
            func.percentile_cont(0.99).within_group(run).cast(Interval),
        )
        .where(
            j.status == any_(literal([SUCCEEDED, DEAD], ARRAY(Text))),
            j.started_at.is_not(None),
            j.finished_at >= func.now() - seconds("window"),
        )
        .group_by(j.task)
        .order_by(j.task)
    )


@cache
def live_workers() -> Select[Any]:
    """Workers whose heartbeat was seen in the last ``:stale_after`` seconds."""
    return (
        select(w.name, w.host, w.pid, w.queues, w.concurrency, w.started_at, w.last_seen_at)
        .where(w.last_seen_at >= func.now() - seconds("stale_after"))
        .order_by(w.name)
    )


# -- statement builders: the worker registry -------------------------------------------------


@cache
def upsert_worker() -> Insert:
    """Register worker ``:name`` (or refresh its row if the name is already there)."""
    stmt = pg_insert(workers_table).values(
        name=bindparam("name", type_=Text),
        host=bindparam("host", type_=Text),
        pid=bindparam("pid", type_=Integer),
        queues=bindparam("queues", type_=ARRAY(Text)),
        concurrency=bindparam("concurrency", type_=Integer),
        started_at=func.now(),
        last_seen_at=func.now(),
    )
    return stmt.on_conflict_do_update(
        index_elements=[w.name],
        set_={
            "host": stmt.excluded.host,
            "pid": stmt.excluded.pid,
            "queues": stmt.excluded.queues,
            "concurrency": stmt.excluded.concurrency,
            "started_at": stmt.excluded.started_at,
            "last_seen_at": stmt.excluded.last_seen_at,
        },
    )


@cache
def touch_worker_row() -> Update:
    """Record that worker ``:worker_name`` is alive; its name, or no row if it was expired."""
    return (
        update(workers_table)
        .where(w.name == bindparam("worker_name", type_=Text))
        .values(last_seen_at=func.now())
        .returning(w.name)
    )


@cache
def delete_worker() -> ReturningDelete[str]:
    """Remove worker ``:worker_name``'s row; returns its name, or no row if there was none."""
    return (
        delete(workers_table)
        .where(w.name == bindparam("worker_name", type_=Text))
        .returning(w.name)
    )


@cache
def delete_stale_workers() -> ReturningDelete[str]:
    """Remove the rows of workers not seen for ``:stale_after`` seconds; returns their names."""
    return (
        delete(workers_table)
        .where(w.last_seen_at < func.now() - seconds("stale_after"))
        .returning(w.name)
    )


# -- input checks ----------------------------------------------------------------------------


def check_statuses(statuses: str | Iterable[str]) -> list[str]:
    """The statuses as a list; InvalidJobError naming the valid ones if any is unknown."""
    wanted = [statuses] if isinstance(statuses, str) else list(statuses)
    unknown = [s for s in wanted if s not in STATUSES]
    if unknown or not wanted:
        raise InvalidJobError(
            f"unknown status {', '.join(map(repr, unknown)) or 'list (empty)'}:"
            f" expected one or more of {', '.join(STATUSES)}"
        )
    return wanted


def check_limit(limit: object, name: str = "limit") -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise InvalidJobError(f"{name} must be an int from 1 to {MAX_PAGE}, not {limit!r}")
    return limit


def check_age(age: object, name: str = "older_than") -> float:
    """A non-negative timedelta, as seconds for :func:`~sa_jobqueue._sql.clock.seconds`."""
    if not isinstance(age, timedelta) or age < timedelta(0):
        raise InvalidJobError(f"{name} must be a timedelta of 0 or more, not {age!r}")
    return age.total_seconds()


# -- statistics ------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueueStats:
    """One queue: jobs per status, what is due now, and what finished within the window."""

    queue: str
    #: Jobs per status, every status present (0 if none).
    counts: dict[str, int]
    #: Queued jobs whose time has come (``visible_at <= now()``).
    due: int
    #: How long the oldest due job has been due; None if none is.
    oldest_due_age: timedelta | None
    #: Jobs that finished within the window, per finished status (succeeded, dead, cancelled).
    finished: dict[str, int]


@dataclass(frozen=True)
class TaskRunTimes:
    """Run times of one task's jobs that finished within the window."""

    task: str
    jobs: int
    p50: timedelta
    p99: timedelta


@dataclass(frozen=True)
class WorkerInfo:
    """One row of the worker registry."""

    name: str
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    started_at: datetime
    last_seen_at: datetime


@dataclass(frozen=True)
class Stats:
    """What :func:`stats` returns: per queue, per task, and the live workers."""

    #: The database's ``now()`` the figures were taken at.
    as_of: datetime
    #: How far back "finished" and the run times look.
    window: timedelta
    queues: list[QueueStats]
    tasks: list[TaskRunTimes]
    workers: list[WorkerInfo]


def stats(
    conn: Connection,
    *,
    window: timedelta = timedelta(minutes=10),
    stale_after: timedelta = timedelta(minutes=1),
) -> Stats:
    """Counts per queue and status, backlog ages, recent outcomes, run times and live workers.

    Jobs finished within ``window`` are counted per queue, and their run times give each
    task's p50 and p99 (``percentile_cont``). Workers are live if their heartbeat was seen
    within ``stale_after``. Reads only; runs in ``conn``'s transaction and does not commit.

    Cost: the status counts read the whole table, history included; the run times sort the
    jobs finished within ``window``. Cheap at a few hundred thousand rows, not free at many
    millions; a short ``window`` keeps the percentiles cheap.
    """
    params = {
        "window": check_age(window, "window"),
        "stale_after": check_age(stale_after, "stale_after"),
    }
    as_of: datetime = conn.execute(select(func.now())).scalar_one()
    per_status: dict[str, dict[str, int]] = {}
    for queue, status, n in conn.execute(counts()):
        per_status.setdefault(queue, {})[status] = n
    due = {queue: (n, age) for queue, n, age in conn.execute(due_per_queue())}
    finished: dict[str, dict[str, int]] = {}
    for queue, status, n in conn.execute(finished_per_queue(), params):
        finished.setdefault(queue, {})[status] = n
    queues = [
        QueueStats(
            queue=queue,
            counts={s: per_status.get(queue, {}).get(s, 0) for s in STATUSES},
            due=due.get(queue, (0, None))[0],
            oldest_due_age=due.get(queue, (0, None))[1],
            finished={s: finished.get(queue, {}).get(s, 0) for s in FINISHED_STATUSES},
        )
        for queue in sorted(per_status.keys() | finished.keys())
    ]
    tasks = [
        TaskRunTimes(task, n, p50, p99) for task, n, p50, p99 in conn.execute(run_times(), params)
    ]
    workers = [WorkerInfo(*row) for row in conn.execute(live_workers(), params)]
    return Stats(as_of=as_of, window=window, queues=queues, tasks=tasks, workers=workers)


# -- purge -----------------------------------------------------------------------------------


def purge(
    conn: Connection,
    statuses: Collection[str],
    older_than: timedelta,
    queue: str | None = None,
    task: str | None = None,
    batch: int = 1000,
) -> int:
    """Delete finished jobs of ``statuses`` that finished more than ``older_than`` ago.

    ``statuses`` must be finished ones (succeeded, dead, cancelled); queued and running jobs
    are refused with InvalidJobError. Deletes in batches of at most ``batch`` rows, committing
    each on ``conn``, so locks are held briefly and an interrupted purge keeps what it did;
    ``conn`` must therefore not be inside a transaction. Returns the number of jobs deleted.

    Rows locked by someone else at that moment (a job being requeued) are skipped, not
    waited for. Not atomic: a job that finishes while the purge runs may or may not go.
    """
    params = _purge_params(statuses, older_than, queue, task)
    params["batch"] = check_limit(batch, "batch")
    if conn.in_transaction():
        raise InvalidJobError(
            "purge commits batch by batch: pass a Connection with no transaction in progress"
        )
    statement = purge_batch(queue is not None, task is not None)
    deleted = 0
    after_id = 0
    while True:
        with conn.begin():
            ids = conn.execute(statement, {**params, "after_id": after_id}).scalars().all()
        deleted += len(ids)
        # Fewer rows than asked means no unlocked row is left past after_id.
        if len(ids) < batch:
            return deleted
        after_id = max(ids)


def count_purge(
    conn: Connection,
    statuses: Collection[str],
    older_than: timedelta,
    queue: str | None = None,
    task: str | None = None,
) -> int:
    """How many jobs :func:`purge` would delete now (a dry run); in ``conn``'s transaction."""
    params = _purge_params(statuses, older_than, queue, task)
    statement = count_purgeable(queue is not None, task is not None)
    return conn.execute(statement, params).scalar_one()


def _purge_params(
    statuses: Collection[str], older_than: timedelta, queue: str | None, task: str | None
) -> dict[str, Any]:
    wanted = check_statuses(statuses)
    live = [s for s in wanted if s not in FINISHED_STATUSES]
    if live:
        raise InvalidJobError(
            f"refusing to purge {' and '.join(live)} jobs: only finished ones"
            f" ({', '.join(FINISHED_STATUSES)}) can be purged; cancel a job first"
        )
    params: dict[str, Any] = {"statuses": wanted, "older_than": check_age(older_than)}
    if queue is not None:
        params["queue"] = check_queue_name(queue)
    if task is not None:
        params["task"] = check_task_name(task)
    return params


# -- the worker registry ---------------------------------------------------------------------


def register_worker(
    conn: Connection, name: str, host: str, pid: int, queues: Sequence[str], concurrency: int
) -> None:
    """Add (or replace) worker ``name``'s row in the registry, seen now.

    Runs in ``conn``'s transaction. The registry is informational (``stats``, ``check``):
    no claim depends on it, so a worker whose row was expired keeps working.
    """
    conn.execute(
        upsert_worker(),
        {
            "name": name,
            "host": host,
            "pid": pid,
            "queues": list(queues),
            "concurrency": concurrency,
        },
    )


def touch_worker(conn: Connection, name: str) -> bool:
    """Set worker ``name``'s ``last_seen_at`` to now; False if its row is gone (re-register)."""
    return conn.execute(touch_worker_row(), {"worker_name": name}).first() is not None


def unregister_worker(conn: Connection, name: str) -> bool:
    """Remove worker ``name``'s row (on a clean shutdown); False if there was none."""
    return conn.execute(delete_worker(), {"worker_name": name}).first() is not None


def expire_workers(conn: Connection, stale_after: timedelta) -> list[str]:
    """Remove the rows of workers not seen for ``stale_after``; returns their names."""
    params = {"stale_after": check_age(stale_after, "stale_after")}
    return list(conn.execute(delete_stale_workers(), params).scalars())
