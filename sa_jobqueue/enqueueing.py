"""Writing validated jobs into the caller's transaction: the I/O behind ``JobQueue.enqueue``.

:class:`NewJobs` is what enqueue has checked before any SQL is sent. :func:`insert_one` and
:func:`insert_many` run the statements on a sync Connection, unique keys and their retry
included. :func:`run_async` runs exactly that code for an ``AsyncSession`` or
``AsyncConnection``, inside SQLAlchemy's greenlet bridge, so the async methods are thin shells
around the same logic and keep the same guarantees: same statements, same transaction, same
NOTIFY bookkeeping (keyed by the sync Transaction objects the async ones wrap).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeAlias, TypeVar

from sqlalchemy import Connection

from ._sql import enqueue as enqueue_sql
from .errors import JobQueueError

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_scoped_session

    AsyncSessionLike: TypeAlias = (
        AsyncSession | async_scoped_session[AsyncSession] | AsyncConnection
    )

T = TypeVar("T")

#: How many times a unique insert is tried again when the job holding its key finished between
#: the insert and the lookup. Each retry needs another transaction to enqueue and finish a job
#: with the same key within those two statements, so more than two rounds is already unheard of.
UNIQUE_ROUNDS: Final = 10


class Enqueued(int):
    """A job's id, as ``enqueue`` returns it, with ``created``: whether this call added the job.

    It is an ``int`` (it compares, hashes, formats and serialises as the plain id), so code that
    takes the id as an int keeps working. ``created`` is False when the job's unique key was
    already held by a queued or running job of its task: the id is then that job's, and nothing
    was added. Without a unique key, ``created`` is always True.
    """

    created: bool

    def __new__(cls, job_id: int, created: bool = True) -> Enqueued:
        self = super().__new__(cls, job_id)
        self.created = created
        return self


@dataclass(frozen=True)
class NewJobs:
    """Jobs of one task, checked and encoded, ready to insert: everything but the I/O.

    ``params`` holds the task, queue, priority, max_attempts, lease (seconds) and ``run_at`` or
    ``delay``; ``schedule`` names which of the last two (see ``enqueue_sql.insert_job``).
    ``keys`` runs parallel to ``payloads`` (None: no uniqueness for that job).
    ``trace_context`` is the enqueuer's W3C trace context as JSON text, for every job, when
    the queue traces and a trace is active (see :mod:`sa_jobqueue.tracing`); else None.
    """

    params: dict[str, Any]
    schedule: str
    payloads: list[str]
    keys: list[str | None]
    trace_context: str | None = None
    #: The job's own retry policy (Backoff.to_json as JSON text), if enqueue was given one.
    backoff: str | None = None

    @property
    def queue(self) -> str:
        queue: str = self.params["queue"]
        return queue

    @property
    def task(self) -> str:
        task: str = self.params["task"]
        return task


def insert_one(conn: Connection, new: NewJobs, sent: set[str]) -> Enqueued:
    """Insert ``new``'s one job; ``sent`` are the queues already notified in the transaction."""
    params = {**new.params, "payload": new.payloads[0]}
    key = new.keys[0]
    wake = new.queue not in sent
    traced = new.trace_context is not None
    if traced:
        params["trace_context"] = new.trace_context
    policy = new.backoff is not None
    if policy:
        params["backoff"] = new.backoff
    if key is None:
        job_id = conn.execute(
            enqueue_sql.insert_job(new.schedule, wake, traced=traced, backoff=policy), params
        ).scalar_one()
        sent.add(new.queue)
        return Enqueued(job_id)
    params["unique_key"] = key
    insert = enqueue_sql.insert_job(new.schedule, wake, unique=True, traced=traced, backoff=policy)
    for _ in range(UNIQUE_ROUNDS):
        row = conn.execute(insert, params).first()
        if row is not None:
            sent.add(new.queue)  # the NOTIFY rode in RETURNING, which only an inserted row runs
            return Enqueued(row[0])
        found = conn.execute(
            enqueue_sql.find_unique(), {"task": new.task, "unique_keys": [key]}
        ).first()
        if found is not None:
            return Enqueued(found[1], created=False)
        # The live job that held the key finished between the two statements: insert again.
    raise _churn(new.task)


def insert_many(conn: Connection, new: NewJobs, sent: set[str]) -> list[Enqueued]:
    """Insert ``new``'s jobs in one statement (more only for unique keys); ids in order."""
    bulk = {k if k in ("run_at", "delay") else f"b_{k}": v for k, v in new.params.items()}
    if new.trace_context is not None:
        bulk["b_trace_context"] = new.trace_context
    if new.backoff is not None:
        bulk["b_backoff"] = new.backoff
    if all(key is None for key in new.keys):
        rows = conn.execute(
            enqueue_sql.insert_jobs(
                new.schedule,
                traced=new.trace_context is not None,
                backoff=new.backoff is not None,
            ),
            {**bulk, "payloads": new.payloads},
        )
        result = [Enqueued(job_id) for job_id in rows.scalars()]
    else:
        result = _insert_unique_many(conn, new, bulk)
    if new.queue not in sent and any(job.created for job in result):
        conn.execute(enqueue_sql.notify(), {"queue": new.queue})
        sent.add(new.queue)
    return result


def _insert_unique_many(conn: Connection, new: NewJobs, bulk: dict[str, Any]) -> list[Enqueued]:
    # Only the first payload of each key is sent; later ones in the batch get its job. One
    # statement then never holds a key twice.
    first: dict[str, int] = {}
    for i, key in enumerate(new.keys):
        if key is not None:
            first.setdefault(key, i)
    result: list[Enqueued | None] = [None] * len(new.keys)
    todo = [i for i, key in enumerate(new.keys) if key is None or first[key] == i]
    for _ in range(UNIQUE_ROUNDS):
        rows = conn.execute(
            enqueue_sql.insert_jobs(
                new.schedule,
                unique=True,
                traced=new.trace_context is not None,
                backoff=new.backoff is not None,
            ),
            {
                **bulk,
                "payloads": [new.payloads[i] for i in todo],
                "unique_keys": [new.keys[i] for i in todo],
            },
        ).all()
        inserted = {key: job_id for job_id, key in rows if key is not None}
        # Rows without a key are never skipped and come back in payload order, as in the
        # plain batch insert (INSERT ... SELECT FROM unnest keeps the array's order).
        keyless = iter([job_id for job_id, key in rows if key is None])
        skipped: list[int] = []
        for i in todo:
            key = new.keys[i]
            if key is None:
                result[i] = Enqueued(next(keyless))
            elif key in inserted:
                result[i] = Enqueued(inserted[key])
            else:
                skipped.append(i)
        if not skipped:
            break
        live = {
            key: job_id
            for key, job_id in conn.execute(
                enqueue_sql.find_unique(),
                {"task": new.task, "unique_keys": [new.keys[i] for i in skipped]},
            )
        }
        todo = []
        for i in skipped:
            key = new.keys[i]
            if key is not None and key in live:
                result[i] = Enqueued(live[key], created=False)
            else:
                todo.append(i)  # its live job finished between the two statements
        if not todo:
            break
    else:
        raise _churn(new.task)
    ids: list[Enqueued] = []
    for i, job in enumerate(result):
        if job is None:  # a later duplicate of a key within the batch: the first one's job
            key = new.keys[i]
            assert key is not None
            original = result[first[key]]
            assert original is not None
            job = Enqueued(original, created=False)
        ids.append(job)
    return ids


def _churn(task: str) -> JobQueueError:
    return JobQueueError(
        f"task {task!r}: the live job holding the unique key finished {UNIQUE_ROUNDS} times"
        " between the insert and the lookup; nothing was added"
    )


async def run_async(session: AsyncSessionLike, work: Callable[[Connection], T]) -> T:
    """Run ``work`` on the sync Connection behind an async session or connection, awaited.

    SQLAlchemy's ``run_sync`` runs it in a greenlet whose database calls are awaited on the
    caller's event loop: the sync code path, in the caller's transaction, without blocking.
    """
    # Imported here: sqlalchemy.ext.asyncio needs greenlet, which only async callers must have.
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_scoped_session

    if isinstance(session, AsyncConnection):
        return await session.run_sync(work)
    if isinstance(session, async_scoped_session):
        session = session()  # the current task's AsyncSession
    if isinstance(session, AsyncSession):
        # Session.connection() joins the session's transaction without flushing.
        return await session.run_sync(lambda sync: work(sync.connection()))
    raise TypeError(
        "the async methods need a SQLAlchemy AsyncSession, async_scoped_session or"
        f" AsyncConnection, not {type(session).__name__} (for a Session or Connection, call"
        " the method without the 'a' prefix)"
    )
