"""Enqueueing, under ``JobQueue.enqueue`` and periodic ticks: resolve, check, then insert.

Three steps, the first two without I/O:

1. :func:`resolve_options` turns a task's declared defaults and the per-call overrides into one
   checked :class:`EnqueueOptions`. Every enqueue path goes through it: ``enqueue``,
   ``enqueue_many``, their async twins and :func:`sa_jobqueue.periodic.enqueue_due`.
2. :func:`new_jobs` encodes the payloads and settles the unique keys: a :class:`NewJobs`.
3. :func:`insert_one` and :func:`insert_many` run the statements on the caller's Connection,
   unique keys and their retry included, and send at most one NOTIFY per queue per transaction
   (riding in the insert's own round trip where they can; :func:`wake` otherwise). One job is
   one INSERT, sent straight to psycopg when nothing could tell (see
   :func:`sa_jobqueue._binds.first_row`); a batch of :data:`COPY_FROM` jobs or more without
   unique keys goes in by COPY, a smaller or unique one by one INSERT from arrays. A unique
   job whose key is held then takes a guarded UPDATE of the holder (replace and debounce
   modes), and a lookup of the holder when that did not apply.

Bad input raises in steps 1 and 2, so nothing is sent and the caller's transaction stays usable.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from sqlalchemy import Connection, Insert
from sqlalchemy.engine.base import Transaction

from ._binds import copy_possible, copy_rows, first_row
from ._sql import enqueue as enqueue_sql
from ._validation import (
    check_lease,
    check_max_attempts,
    check_priority,
    check_queue_name,
    check_run_at,
    check_unique_key,
    check_unique_mode,
    check_unique_period,
    encode_payload,
)
from .errors import InvalidJobError, JobQueueError
from .tasks import Backoff, Task, check_backoff

#: How many times a unique insert is tried again when the job holding its key finished between
#: the insert and the lookup. Each retry needs another transaction to enqueue and finish a job
#: with the same key within those two statements: rare, but four enqueuers racing a loop that
#: finishes the key's job as fast as it can lost ten rounds in a row once in a test run. Each
#: round is two short statements, so the bound is set far past any real churn.
UNIQUE_ROUNDS: Final = 100

#: The smallest batch that goes in by COPY. COPY costs two more round trips than the INSERT
#: (one to draw the ids, one more for COPY's own handshake) and saves per job: no array to
#: build and quote, no unnest, PostgreSQL's batched insert. With the server on the same
#: machine the two break even between 50 and 100 jobs (bench/enqueue_cost.py measures both
#: paths); 200 leaves room for a network's longer round trips.
COPY_FROM: Final = 200


class Enqueued(int):
    """A job's id, as ``enqueue`` returns it, with ``created``: whether this call added the job.

    It is an ``int`` (it compares, hashes, formats and serialises as the plain id), so code that
    takes the id as an int keeps working. ``created`` is False when the job's unique key was
    already held by a job of its task: the id is then that job's, and nothing was added.
    ``updated`` is True when, instead, this call gave that job (a queued one) its payload,
    priority and due time: the replace and debounce unique modes. Neither: the key's job was
    left as it was (skip mode, or a running or finished holder). Without a unique key,
    ``created`` is always True.
    """

    created: bool
    updated: bool

    def __new__(cls, job_id: int, created: bool = True, updated: bool = False) -> Enqueued:
        self = super().__new__(cls, job_id)
        self.created = created
        self.updated = updated
        return self


# -- 1. options ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class EnqueueOptions:
    """Where, when and how the jobs of one enqueue run: checked, and final.

    Built by :func:`resolve_options` only. ``run_at`` is None (due now), an aware datetime or
    a delay from the database's ``now()``. ``backoff`` is the job's own retry policy if the
    call gave one (stored with the job); None leaves the task's, which is not stored.
    ``unique_mode`` and ``unique_period`` apply to the jobs that get a unique key.
    """

    task: Task
    queue: str
    priority: int
    max_attempts: int
    lease: timedelta
    run_at: datetime | timedelta | None = None
    backoff: Backoff | None = None
    unique_mode: str = "skip"
    unique_period: timedelta | None = None

    @property
    def period_seconds(self) -> int | None:
        """The unique period in whole seconds (checked to be whole), or None."""
        return None if self.unique_period is None else int(self.unique_period.total_seconds())

    @property
    def schedule(self) -> str:
        """How the job's due time is given to the statement: "now", "at" or "after"."""
        if isinstance(self.run_at, datetime):
            return "at"
        return "after" if isinstance(self.run_at, timedelta) else "now"

    def params(self, prefix: str = "") -> dict[str, Any]:
        """The job's bind parameters (names after ``prefix``; ``run_at``/``delay`` never take it).

        ``lease`` and ``delay`` are seconds (see :func:`sa_jobqueue._sql.clock.seconds`).
        """
        params: dict[str, Any] = {
            f"{prefix}task": self.task.name,
            f"{prefix}queue": self.queue,
            f"{prefix}priority": self.priority,
            f"{prefix}max_attempts": self.max_attempts,
            f"{prefix}lease": self.lease.total_seconds(),
        }
        if isinstance(self.run_at, datetime):
            params["run_at"] = self.run_at
        elif isinstance(self.run_at, timedelta):
            params["delay"] = self.run_at.total_seconds()
        return params


def resolve_options(
    task: Task,
    run_at: datetime | timedelta | None = None,
    priority: int | None = None,
    queue: str | None = None,
    max_attempts: int | None = None,
    lease: timedelta | None = None,
    backoff: Backoff | None = None,
    unique_mode: str | None = None,
    unique_period: timedelta | None = None,
) -> EnqueueOptions:
    """``task``'s defaults with the overrides that are not None applied, each one checked.

    In debounce mode, a job given no ``run_at`` is due the task's ``debounce`` delay from now.
    Raises an InvalidJobError subclass naming the first bad option; no I/O.
    """
    mode = check_unique_mode(unique_mode if unique_mode is not None else task.unique_mode)
    period = check_unique_period(unique_period if unique_period is not None else task.unique_period)
    if run_at is None and mode == "debounce":
        run_at = task.debounce
    run_at = check_run_at(run_at)
    resolved = EnqueueOptions(
        task=task,
        queue=check_queue_name(queue if queue is not None else task.queue),
        priority=check_priority(priority if priority is not None else task.priority),
        max_attempts=check_max_attempts(
            max_attempts if max_attempts is not None else task.max_attempts
        ),
        lease=check_lease(lease if lease is not None else task.lease),
        run_at=run_at,
        backoff=backoff,
        unique_mode=mode,
        unique_period=period,
    )
    check_backoff(backoff)
    return resolved


# -- 2. jobs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NewJobs:
    """Jobs of one task, checked and encoded, ready to insert: everything but the I/O.

    ``payloads`` are JSON texts; ``keys`` runs parallel to them (None: no uniqueness for that
    job), and ``unique`` says whether any of them is a key. ``trace_context`` is the
    enqueuer's W3C trace context as JSON text, for every job, when the queue traces and a
    trace is active (see :mod:`sa_jobqueue.tracing`); else None.
    """

    options: EnqueueOptions
    payloads: list[str]
    keys: list[str | None]
    trace_context: str | None = None
    unique: bool = False

    @property
    def queue(self) -> str:
        return self.options.queue

    @property
    def task(self) -> str:
        return self.options.task.name

    def params(self, prefix: str = "") -> dict[str, Any]:
        """:meth:`EnqueueOptions.params` plus the trace context and the job's own backoff."""
        params = self.options.params(prefix)
        if self.trace_context is not None:
            params[f"{prefix}trace_context"] = self.trace_context
        if self.options.backoff is not None:
            params[f"{prefix}backoff"] = json.dumps(self.options.backoff.to_json())
        return params


def new_jobs(
    options: EnqueueOptions,
    payloads: Sequence[Any],
    unique_keys: Sequence[str | None] | None,
    *,
    max_payload_bytes: int,
    trace_context: Callable[[], str | None] | None = None,
) -> NewJobs:
    """Encode ``payloads`` and settle their keys; ``unique_keys`` runs parallel to them.

    For a None key (or no ``unique_keys`` at all) the task's ``unique_key`` function, if it
    declares one, gives the key; its errors propagate. ``trace_context`` is called last, once,
    if given. No I/O. A task with a typed payload checks each against its type first
    (PayloadTypeError).
    """
    task = options.task
    codec = task.payload_codec
    if codec is not None:
        # Typed payloads: checked against the type and made JSON first; the unique_key
        # function gets them as the handler will (a dataclass given as a dict, made one).
        prepared = [codec.prepare(p) for p in payloads]
        payloads = [typed for typed, _ in prepared]
        encoded = [encode_payload(data, max_bytes=max_payload_bytes) for _, data in prepared]
    else:
        encoded = [encode_payload(p, max_bytes=max_payload_bytes) for p in payloads]
    if unique_keys is not None and len(unique_keys) != len(payloads):
        raise InvalidJobError(
            f"unique_keys has {len(unique_keys)} entries for {len(payloads)} payloads"
        )
    derive = task.unique_key
    keys: list[str | None]
    if derive is None and (unique_keys is None or all(key is None for key in unique_keys)):
        keys = [None] * len(payloads)  # no uniqueness: nothing to check per job
        unique = False
    else:
        given = [None] * len(payloads) if unique_keys is None else unique_keys
        keys = [
            check_unique_key(
                key if key is not None or derive is None else derive(payload), task=task.name
            )
            for payload, key in zip(payloads, given, strict=True)
        ]
        unique = any(key is not None for key in keys)
    trace = trace_context() if trace_context is not None else None
    return NewJobs(options, encoded, keys, trace, unique)


# -- 3. the I/O ---------------------------------------------------------------------------------


def insert_one(conn: Connection, new: NewJobs) -> Enqueued:
    """Insert ``new``'s one job in ``conn``'s transaction; wakes its queue's workers at commit.

    One round trip for a job without a unique key: the INSERT, its NOTIFY in its RETURNING.
    """
    sent = sent_notifications(conn)
    params = new.params()
    params["payload"] = new.payloads[0]
    key = new.keys[0]
    wake_up = new.queue not in sent
    traced = new.trace_context is not None
    policy = new.options.backoff is not None
    if key is None:
        statement = enqueue_sql.insert_job(
            new.options.schedule, wake_up, traced=traced, backoff=policy
        )
        row = first_row(conn, statement, params)
        assert row is not None  # an INSERT without ON CONFLICT returns its row or raises
        sent.add(new.queue)
        return Enqueued(row[0])
    params["unique_key"] = key
    options = new.options
    period = options.period_seconds
    if period is not None:
        params["unique_period"] = period
    insert = enqueue_sql.insert_job(
        options.schedule, wake_up, unique=True, traced=traced, backoff=policy, period=bool(period)
    )
    update = None
    if options.unique_mode != "skip":
        update = enqueue_sql.update_held(options.unique_mode, options.schedule, traced=traced)
        replacing = {**new.params("b_"), "b_payload": params["payload"], "b_unique_key": key}
    lookup = {"task": new.task, "unique_keys": [key], "unique_period": period}
    for _ in range(UNIQUE_ROUNDS):
        row = first_row(conn, insert, params)
        if row is not None:
            sent.add(new.queue)  # the NOTIFY rode in RETURNING, which only an inserted row runs
            return Enqueued(row[0])
        if update is not None:
            held = conn.execute(update, replacing).first()
            if held is not None:
                if held[2] is not None:
                    sent.add(held[2])  # due now: the holder's queue was notified
                return Enqueued(held[0], created=False, updated=True)
            # Not queued (running, or finished in its window), or gone: look it up.
        found = conn.execute(enqueue_sql.find_unique(bool(period)), lookup).first()
        if found is not None:
            return Enqueued(found[1], created=False)
        # The live job that held the key finished between the two statements: insert again.
    raise _churn(new.task)


def insert_many(conn: Connection, new: NewJobs) -> list[Enqueued]:
    """Insert ``new``'s jobs, by COPY or in one INSERT (more only for unique keys); ids in order.

    The NOTIFY rides in the same round trip as the ids (the INSERT's RETURNING, or the id
    draw before a COPY), once, and only if a job was added.
    """
    sent = sent_notifications(conn)
    wake_up = new.queue not in sent
    if not new.unique and len(new.payloads) >= COPY_FROM and copy_possible(conn):
        result = _copy_many(conn, new, wake_up)
        sent.add(new.queue)
        return result
    # INSERT ... SELECT may not reuse a column's name for a bind parameter, hence "b_".
    bulk = new.params("b_")
    period = new.options.period_seconds if new.unique else None
    if period is not None:
        bulk["b_unique_period"] = period
    statement = enqueue_sql.insert_jobs(
        new.options.schedule,
        unique=new.unique,
        traced=new.trace_context is not None,
        backoff=new.options.backoff is not None,
        wake=wake_up,
        period=period is not None,
    )
    if not new.unique:
        rows = conn.execute(statement, {**bulk, "payloads": new.payloads})
        result = [Enqueued(job_id) for job_id in rows.scalars()]
    else:
        result = _insert_unique_many(conn, new, statement, bulk, sent)
    if any(job.created for job in result):
        sent.add(new.queue)  # if it was not already, the NOTIFY rode in RETURNING
    return result


def _copy_many(conn: Connection, new: NewJobs, wake_up: bool) -> list[Enqueued]:
    """COPY ``new``'s jobs in (no unique keys), after one statement that draws their ids."""
    options = new.options
    schedule = options.schedule
    params: dict[str, Any] = {"n": len(new.payloads), "lease": options.lease.total_seconds()}
    if isinstance(options.run_at, timedelta):
        params["delay"] = options.run_at.total_seconds()
    if wake_up:
        params["queue"] = options.queue
    drawn = conn.execute(enqueue_sql.reserve_jobs(schedule, wake_up), params).one()
    # Drawn in generate_series order, so ascending; sorted in case the aggregate's order is not
    # the draw's: the jobs' ids then follow the payloads' order, as the INSERT's do.
    ids: list[int] = sorted(drawn.ids)
    tail: list[Any] = [options.queue, options.task.name, options.priority]
    tail += [options.max_attempts, drawn.lease]
    if schedule == "at":
        tail.append(options.run_at)
    elif schedule == "after":
        tail.append(drawn.visible_at)
    if new.trace_context is not None:
        tail.append(new.trace_context)
    if options.backoff is not None:
        tail.append(json.dumps(options.backoff.to_json()))
    statement = enqueue_sql.copy_jobs(
        schedule, traced=new.trace_context is not None, backoff=options.backoff is not None
    )
    copy_rows(
        conn,
        statement,
        ((job_id, payload, *tail) for job_id, payload in zip(ids, new.payloads, strict=True)),
    )
    return [Enqueued(job_id) for job_id in ids]


def _insert_unique_many(
    conn: Connection, new: NewJobs, statement: Insert, bulk: dict[str, Any], sent: set[str]
) -> list[Enqueued]:
    options = new.options
    replace = options.unique_mode != "skip"
    # One payload per key is sent, so one statement never holds a key twice: the first one in
    # skip mode (a later one would be skipped), the last one in replace and debounce modes (it
    # would replace the earlier ones, one call after another).
    sent_for: dict[str, int] = {}
    for i, key in enumerate(new.keys):
        if key is not None:
            if replace:
                sent_for[key] = i
            else:
                sent_for.setdefault(key, i)
    done: dict[int, Enqueued] = {}
    todo = [i for i, key in enumerate(new.keys) if key is None or sent_for[key] == i]
    period = bulk.get("b_unique_period")
    update = None
    if replace:
        traced = new.trace_context is not None
        update = enqueue_sql.update_held(options.unique_mode, options.schedule, traced, many=True)
    for _ in range(UNIQUE_ROUNDS):
        # Keys in one order (keyless payloads first, in theirs): two batches sharing keys then
        # take them one after another in the same order and wait for each other rather than
        # deadlock, as they could taking them in the order their payloads came in.
        todo.sort(key=lambda i: (new.keys[i] is not None, new.keys[i] or ""))
        rows = conn.execute(
            statement,
            {
                **bulk,
                "payloads": [new.payloads[i] for i in todo],
                "unique_keys": [new.keys[i] for i in todo],
            },
        ).all()
        # (id, unique_key), and a third column when the statement carries the NOTIFY.
        inserted = {row[1]: row[0] for row in rows if row[1] is not None}
        # Rows without a key are never skipped and come back in payload order, as in the
        # plain batch insert (INSERT ... SELECT FROM unnest keeps the array's order).
        keyless = iter([row[0] for row in rows if row[1] is None])
        skipped: list[int] = []
        for i in todo:
            key = new.keys[i]
            if key is None:
                done[i] = Enqueued(next(keyless))
            elif key in inserted:
                done[i] = Enqueued(inserted[key])
            else:
                skipped.append(i)
        if skipped and update is not None:
            held = conn.execute(
                update,
                {
                    **bulk,
                    "payloads": [new.payloads[i] for i in skipped],
                    "unique_keys": [new.keys[i] for i in skipped],
                },
            ).all()
            sent.update(row[2] for row in held if row[2] is not None)  # due now: notified
            updated = {row[1]: row[0] for row in held}
            left = []
            for i in skipped:
                key = new.keys[i]
                if key in updated:
                    done[i] = Enqueued(updated[key], created=False, updated=True)
                else:
                    left.append(i)
            skipped = left
        if not skipped:
            break
        live: dict[str, int] = {}
        for key, job_id in conn.execute(
            enqueue_sql.find_unique(period is not None),
            {
                "task": new.task,
                "unique_keys": [new.keys[i] for i in skipped],
                "unique_period": period,
            },
        ):
            live.setdefault(key, job_id)  # a key's first row is its holder (see find_unique)
        todo = []
        for i in skipped:
            key = new.keys[i]
            if key is not None and key in live:
                done[i] = Enqueued(live[key], created=False)
            else:
                todo.append(i)  # its live job finished between the two statements
        if not todo:
            break
    else:
        raise _churn(new.task)
    # Each payload gets its key's job. The first payload of a key gets what happened to it;
    # a later one was not added, and in replace and debounce modes it replaced the earlier
    # payload of a job that is (still) queued, as one call after another would have.
    ids: list[Enqueued] = []
    seen: set[str] = set()
    for i, key in enumerate(new.keys):
        if key is None:
            ids.append(done[i])
            continue
        job = done[sent_for[key]]
        if key not in seen:
            seen.add(key)
            ids.append(job)
        else:
            ids.append(
                Enqueued(job, created=False, updated=replace and (job.created or job.updated))
            )
    return ids


def _churn(task: str) -> JobQueueError:
    return JobQueueError(
        f"task {task!r}: the live job holding the unique key finished {UNIQUE_ROUNDS} times"
        " between the insert and the lookup; nothing was added"
    )


# -- wake-ups -----------------------------------------------------------------------------------

#: Queues already notified in a transaction. Keyed weakly by the innermost transaction object,
#: so the entry vanishes with it; a savepoint gets its own entry because a NOTIFY sent inside a
#: savepoint that is rolled back is dropped with it.
_notified: Final[weakref.WeakKeyDictionary[Transaction, set[str]]] = weakref.WeakKeyDictionary()


def sent_notifications(conn: Connection) -> set[str]:
    """The queues already notified in the connection's current (innermost) transaction."""
    txn = conn.get_nested_transaction() or conn.get_transaction()
    if txn is None:
        # Not in a transaction yet: the insert is about to autobegin one. Begin it now so the
        # bookkeeping has a transaction to hang on.
        txn = conn.begin()
    return _notified.setdefault(txn, set())


def wake(conn: Connection, queue: str) -> None:
    """Wake ``queue``'s idle workers when ``conn``'s transaction commits, once per transaction."""
    sent = sent_notifications(conn)
    if queue not in sent:
        conn.execute(enqueue_sql.notify(), {"queue": queue})
        sent.add(queue)
