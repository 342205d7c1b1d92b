"""Helpers for testing an application's tasks: drain the queue, assert on enqueued jobs, run one.

Import them from here (``from sa_jobqueue.testing import drain, assert_enqueued, run_task``);
they are not re-exported by ``sa_jobqueue``. Nothing here needs pytest, but failed assertions
raise ``AssertionError`` with a message that lists what was found instead, and pytest hides
these helpers' own frames from the traceback.

* :func:`enqueued_jobs`, :func:`assert_enqueued`, :func:`refute_enqueued` read the jobs table
  in *your* transaction, so they see what your code enqueued before it committed.
* :func:`run_task` calls one handler in-process with a made-up :class:`~sa_jobqueue.JobContext`;
  its ``ctx.session`` writes land in your transaction, which it never commits.
* :func:`drain` runs every due job with a real :class:`~sa_jobqueue.Worker` in burst mode. The
  worker runs each job in its own transaction on its own connection, as in production, so it
  only sees **committed** jobs and rows.

A test suite that wraps each test in one transaction rolled back at the end can use the first
four as they are. ``drain`` cannot see into such a transaction (and refuses a session or
connection that has uncommitted writes, rather than find nothing or wait on its row locks):
test enqueueing with :func:`assert_enqueued` and handlers with :func:`run_task` there, and keep
``drain`` for tests that commit, on a database they clean up afterwards (delete your rows and
``sa_jobqueue_jobs``, or use a fresh database per test).

What is not promised: that a job behaves under ``drain`` exactly as under a production worker
in every detail. ``drain`` runs one job at a time (in priority, due-time, id order) and never
enqueues periodic ticks; ``run_task`` neither enforces the task's timeout nor records anything
in the jobs table.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import functools
import inspect
import json
import threading
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final, cast
from unittest.mock import ANY

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session, scoped_session

from ._binds import SessionLike
from ._registry import TaskRegistry
from ._sql import testing as testing_sql
from ._sql.clock import database_now
from ._sql.session import transaction_id_if_written
from ._validation import DEFAULT_MAX_PAYLOAD_BYTES, check_queue_name, encode_payload
from .errors import InvalidJobError, JobQueueError
from .models import CANCELLED, DEAD, QUEUED, SUCCEEDED
from .ops import jobs as operations
from .queue import JobInfo, JobQueue
from .tasks import Handler, JobContext, Task
from .worker import Worker
from .worker._sessions import HandlerSession

__all__ = [
    "DrainResult",
    "assert_enqueued",
    "drain",
    "enqueued_jobs",
    "refute_enqueued",
    "run_task",
]


_FIELDS: Final = tuple(f.name for f in dataclasses.fields(JobInfo))
#: Jobs an assertion message lists at most.
_SHOWN: Final = 20


# -- drain ------------------------------------------------------------------------------------


@dataclass(frozen=True, repr=False)
class DrainResult:
    """What :func:`drain` ran: each job once, counted by the state it ended in.

    ``failed`` jobs are queued again, waiting out their backoff (see ``with_retries``). A job
    that failed and then succeeded within the drain counts as succeeded. ``jobs`` holds a
    snapshot of each, in id order (not compared: ``result == DrainResult(2, 0, 0, 0)`` checks
    the counts); ``errors`` holds the last error of the failed and dead ones.
    """

    succeeded: int
    failed: int
    dead: int
    cancelled: int
    jobs: tuple[JobInfo, ...] = field(default=(), compare=False)

    @property
    def job_ids(self) -> list[int]:
        """The ids of the jobs the drain ran, in order."""
        return [job.id for job in self.jobs]

    @property
    def errors(self) -> dict[int, str]:
        """``{job_id: "type: message"}`` for the failed and dead jobs."""
        return {
            job.id: _error_line(job.last_error)
            for job in self.jobs
            if job.status == DEAD or (job.status == QUEUED and job.last_error is not None)
        }

    def __repr__(self) -> str:
        errors = f", errors={self.errors!r}" if self.errors else ""
        return (
            f"DrainResult(succeeded={self.succeeded}, failed={self.failed}, dead={self.dead},"
            f" cancelled={self.cancelled}{errors})"
        )


def drain(
    queue: JobQueue,
    bind: Engine | SessionLike,
    *,
    queues: Iterable[str] | None = None,
    max_jobs: int | None = None,
    with_scheduled: bool = False,
    with_retries: bool = False,
) -> DrainResult:
    """Run every due job of ``queue``'s tasks in this process, one at a time, until none is due.

    ``bind`` is your Engine, or a Session or Connection on it (the worker opens connections of
    its own from that engine). Jobs that handlers enqueue run in the same drain once committed
    and due. The worker is a real :class:`~sa_jobqueue.Worker` in burst mode, with one thread
    and no prefetch: the same claim, fencing, completion and failure handling as in production,
    and no LISTEN connection, retention pruning or periodic ticks.

    ``queues`` defaults to every queue the tasks declare, the default queue, and any queue
    holding jobs. ``max_jobs`` stops the drain once that many attempts have started (a guard
    against handlers that keep enqueueing more work); they still finish.

    A failed attempt is retried after its backoff, as in production, so by default the drain
    does not run it and counts the job as ``failed``. ``with_retries=True`` makes such retries
    due at once, again and again, until every job has succeeded or is dead (``max_attempts``
    bounds it). ``with_scheduled=True`` also runs jobs enqueued for later (``run_at``), including
    ones that handlers enqueue for later during the drain.

    Jobs must be committed: raises JobQueueError if ``bind`` is a Session or Connection whose
    transaction has uncommitted writes (or a Session with unflushed changes), which the
    worker's handlers could neither see nor wait out. After the drain a Session's objects are
    expired, so they load the handlers' writes when next used (unless its transaction is
    REPEATABLE READ or stricter and started before: then only a new transaction sees them).
    """
    if max_jobs is not None and (isinstance(max_jobs, bool) or max_jobs < 1):
        raise InvalidJobError(f"max_jobs must be at least 1, not {max_jobs!r}")
    engine, session = _refuse_uncommitted(bind)
    autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
    with autocommit.connect() as conn:
        started = conn.execute(database_now()).scalar_one()
        names = _queues_to_drain(conn, queue, queues)
    runner = _Drainer(queue, engine, names, max_jobs)
    promote = [
        kind for kind, on in (("scheduled", with_scheduled), ("retries", with_retries)) if on
    ]
    # Bursts until none finds work: a burst can end just before jobs that its last handlers
    # enqueued commit, and retries and scheduled jobs (with the options) come due between them.
    # A burst that started no handler has claimed all it could: jobs still due then are locked
    # by some other transaction of the test's, and waiting for them could take for ever.
    while not runner.limit_reached:
        with autocommit.connect() as conn:
            for kind in promote:
                conn.execute(testing_sql.make_due(kind), {"queues": names})
            if not conn.execute(testing_sql.any_due(), {"queues": names}).scalar_one():
                break
        before = runner.started
        runner.run()
        if runner.started == before:
            break
    if session is not None:
        session.expire_all()
    with engine.connect() as conn:
        return _drain_result(conn, names, started)


class _Drainer:
    """Burst runs of one worker over a copy of the queue whose handlers count their calls."""

    def __init__(
        self, queue: JobQueue, engine: Engine, queues: list[str], max_jobs: int | None
    ) -> None:
        self.engine = engine
        self.queues = queues
        self.max_jobs = max_jobs
        self.started = 0
        self._lock = threading.Lock()
        self._worker: Worker | None = None
        # A shallow copy shares everything with the application's queue but its registry: the
        # same tasks with counting handlers, and no periodic schedules, so that a drain never
        # enqueues a tick and stays deterministic.
        self.queue = copy.copy(queue)
        self.queue._registry = TaskRegistry(
            dataclasses.replace(task, handler=self._counted(task.handler))
            for task in queue.tasks.values()
        )

    @property
    def limit_reached(self) -> bool:
        return self.max_jobs is not None and self.started >= self.max_jobs

    def run(self) -> None:
        self._worker = Worker(
            self.queue,
            self.engine,
            concurrency=1,
            queues=self.queues,
            # With one thread and no prefetch, jobs run one at a time in claim order, and a
            # stop at max_jobs leaves no claimed job behind.
            prefetch=0,
            listen=False,
            retention=None,
            # Burst mode wakes on each finished job; the poll only bounds a missed wake-up.
            poll_interval=timedelta(milliseconds=100),
            name=f"sa_jobqueue.testing:{id(self):x}",
        )
        self._worker.run(burst=True)

    def _started(self) -> None:
        with self._lock:
            self.started += 1
            if self.limit_reached and self._worker is not None:
                self._worker.stop()  # claims no more; this attempt still finishes

    def _counted(self, handler: Handler) -> Handler:
        started = self._started
        if inspect.iscoroutinefunction(handler):

            @functools.wraps(handler)
            async def counted_async(ctx: JobContext, payload: Any) -> object:
                started()
                return await handler(ctx, payload)

            return counted_async

        @functools.wraps(handler)
        def counted(ctx: JobContext, payload: Any) -> object:
            started()
            return handler(ctx, payload)

        return counted


def _refuse_uncommitted(bind: Engine | SessionLike) -> tuple[Engine, Session | None]:
    """The engine behind ``bind``, and the Session to expire afterwards; refuse uncommitted work.

    The worker's connections cannot see uncommitted rows, and its handlers would wait for the
    row locks of uncommitted writes for as long as the caller, who waits for the drain, holds
    them: a test that would hang or find nothing gets an error saying why instead.
    """
    if isinstance(bind, Engine):
        return bind, None
    session: Session | None = None
    conn: Connection | None = None
    if isinstance(bind, Session | scoped_session):
        session = bind() if isinstance(bind, scoped_session) else bind
        if session.new or session.dirty or session.deleted:
            raise JobQueueError(
                "drain() was given a Session with unflushed changes; commit them first: the"
                " worker runs jobs in transactions of its own, which cannot see them"
            )
        target = session.get_bind()
        if session.in_transaction():
            conn = session.connection()
        elif isinstance(target, Connection) and target.in_transaction():
            conn = target
        engine = target if isinstance(target, Engine) else target.engine
    elif isinstance(bind, Connection):
        conn = bind if bind.in_transaction() else None
        engine = bind.engine
    else:
        raise TypeError(
            f"drain() needs an Engine, Session or Connection, not {type(bind).__name__}"
        )
    # A transaction gets an id when it first writes (or locks a row): none means nothing
    # uncommitted that the worker could miss or block on.
    if conn is not None and conn.execute(transaction_id_if_written()).scalar():
        raise JobQueueError(
            "drain() was given a session or connection whose transaction has uncommitted"
            " writes: the worker runs jobs in transactions of its own, which cannot see them"
            " (and would wait for their locks). Commit first; in a test that rolls back one"
            " transaction, use assert_enqueued() and run_task() instead"
        )
    return engine, session


def _queues_to_drain(conn: Connection, queue: JobQueue, queues: Iterable[str] | None) -> list[str]:
    if queues is not None:
        names = [check_queue_name(name) for name in queues]
        if not names:
            raise InvalidJobError("queues is empty: name at least one queue, or pass None")
        return list(dict.fromkeys(names))
    declared = {task.queue for task in queue.tasks.values()} | {queue.default_queue}
    holding = conn.execute(testing_sql.queues_holding_jobs()).scalars()
    return sorted(declared.union(holding))


def _drain_result(conn: Connection, queues: list[str], started: datetime) -> DrainResult:
    rows = conn.execute(testing_sql.claimed_since(_FIELDS), {"queues": queues, "started": started})
    jobs = tuple(JobInfo(**row._asdict()) for row in rows)
    ended = [job.status for job in jobs]
    return DrainResult(
        succeeded=ended.count(SUCCEEDED),
        failed=ended.count(QUEUED),  # claimed, so failed at least once, and waiting to retry
        dead=ended.count(DEAD),
        cancelled=ended.count(CANCELLED),
        jobs=jobs,
    )


# -- assertions on enqueued jobs --------------------------------------------------------------


def enqueued_jobs(
    session: Engine | SessionLike,
    *,
    task: str | Task | None = None,
    payload: Any = ANY,
    queue: str | None = None,
    status: str | Iterable[str] | None = QUEUED,
) -> list[JobInfo]:
    """The jobs matching all the filters given, in id order, read in the caller's transaction.

    A Session or Connection sees what its own transaction enqueued before committing; an
    Engine sees committed jobs. ``payload`` must equal (``==``) the job's payload as a worker
    would decode it; ``unittest.mock.ANY`` matches any value, also inside a dict or list
    (``{"user_id": 1, "token": ANY}``). ``status`` defaults to ``"queued"``;
    None means any status. Reads at most 10,000 jobs.
    """
    params: dict[str, Any] = {"limit": operations.MAX_PAGE}
    if status is not None:
        params["statuses"] = operations.check_statuses(status)
    if queue is not None:
        params["queue"] = check_queue_name(queue)
    if task is not None:
        params["task"] = task.name if isinstance(task, Task) else task
    statement = operations.select_jobs(
        _FIELDS,
        statuses=status is not None,
        queue=queue is not None,
        task=task is not None,
        older_than=False,
        after=False,
    )
    with _reading(session) as conn:
        rows = conn.execute(statement, params)
        return [
            info
            for info in (JobInfo(**row._asdict()) for row in rows)
            if payload is ANY or payload == info.payload
        ]


def assert_enqueued(
    session: Engine | SessionLike,
    *,
    task: str | Task | None = None,
    payload: Any = ANY,
    queue: str | None = None,
    status: str | Iterable[str] | None = QUEUED,
    count: int | None = None,
) -> JobInfo:
    """Assert that a job matching the filters exists (exactly ``count`` of them, if given).

    Filters as :func:`enqueued_jobs`. Returns the newest matching job. On failure, raises
    AssertionError listing the jobs of that status that were found instead.
    """
    __tracebackhide__ = True
    if count is not None and (isinstance(count, bool) or count < 1):
        raise InvalidJobError(f"count must be at least 1 (for none, refute_enqueued), not {count}")
    found = enqueued_jobs(session, task=task, payload=payload, queue=queue, status=status)
    if found and (count is None or len(found) == count):
        return found[-1]
    wanted = _describe(task, payload, queue, status)
    expected = f"a {wanted}" if count is None else f"{count} of ({wanted})"
    if found:  # the wrong number of them
        raise AssertionError(
            f"expected {expected}, found {len(found)}:\n{_listing(found, len(found))}"
        )
    others = enqueued_jobs(session, status=status)
    kind = "jobs" if status is None else f"{_statuses(status)} jobs"
    seen = f"{kind} found:\n{_listing(others, len(others))}" if others else f"no {kind} at all"
    raise AssertionError(f"expected {expected}, found none; {seen}")


def refute_enqueued(
    session: Engine | SessionLike,
    *,
    task: str | Task | None = None,
    payload: Any = ANY,
    queue: str | None = None,
    status: str | Iterable[str] | None = QUEUED,
) -> None:
    """Assert that no job matches the filters (as :func:`enqueued_jobs`); list those that do."""
    __tracebackhide__ = True
    found = enqueued_jobs(session, task=task, payload=payload, queue=queue, status=status)
    if found:
        wanted = _describe(task, payload, queue, status)
        raise AssertionError(
            f"expected no {wanted}, found {len(found)}:\n{_listing(found, len(found))}"
        )


def _describe(
    task: str | Task | None, payload: Any, queue: str | None, status: str | Iterable[str] | None
) -> str:
    parts = ["job" if status is None else f"{_statuses(status)} job"]
    if task is not None:
        parts.append(f"of task {task.name if isinstance(task, Task) else task!r}")
    if queue is not None:
        parts.append(f"in queue {queue!r}")
    if payload is not ANY:
        parts.append(f"with payload {payload!r}")
    return " ".join(parts)


def _statuses(status: str | Iterable[str]) -> str:
    return status if isinstance(status, str) else "/".join(status)


def _listing(jobs: Collection[JobInfo], total: int) -> str:
    lines = [
        f"  #{job.id} {job.task} queue={job.queue!r} status={job.status} payload={job.payload!r}"
        for job in list(jobs)[:_SHOWN]
    ]
    if total > _SHOWN:
        lines.append(f"  ... and {total - _SHOWN} more")
    return "\n".join(lines)


def _error_line(error: Any) -> str:
    if isinstance(error, dict):
        return f"{error.get('type')}: {error.get('message')}"
    return repr(error)


@contextlib.contextmanager
def _reading(bind: Engine | SessionLike) -> Iterator[Connection]:
    """The caller's connection (in its transaction), or a fresh one from an Engine."""
    if isinstance(bind, Engine):
        with bind.connect() as conn:
            yield conn
    else:
        yield _connection(bind)


def _connection(session: SessionLike) -> Connection:
    # Session.connection() joins (or begins) the session's transaction without flushing it.
    if isinstance(session, Session | scoped_session):
        return session.connection()
    if isinstance(session, Connection):
        return session
    raise TypeError(f"expected a Session or Connection, not {type(session).__name__}")


# -- running one task -------------------------------------------------------------------------


def run_task(
    task: Task,
    payload: Any = None,
    *,
    session: SessionLike | None = None,
    job_id: int = 1,
    attempt: int = 1,
    max_attempts: int | None = None,
) -> Any:
    """Call ``task``'s handler on ``payload`` with a made-up JobContext; return what it returns.

    For a task known by name, pass ``queue.get_task(name)``. The payload goes through the same
    JSON encoding as ``enqueue`` (PayloadError if enqueue would refuse it), and the handler
    gets it decoded afresh, as from a worker. An ``async def`` handler runs on a new event loop
    (``asyncio.run``), so call this from a synchronous test. The handler's exceptions propagate.

    ``ctx.session`` writes into the transaction of ``session`` (yours), within a savepoint, as
    in production: ``ctx.session.commit()`` only flushes, and if the handler raises its writes
    roll back while your transaction goes on. Nothing is ever committed: check the writes
    through your session, and roll it back or commit it as your test does. When the handler
    uses ``ctx.session``, your Session is flushed first (so the handler sees your objects) and
    expired afterwards (so they show its writes). Without ``session``, a handler that asks for
    ``ctx.session`` fails with a message saying to pass one.

    ``ctx.job_id``, ``ctx.attempt`` and ``ctx.max_attempts`` (default: the task's) are what you
    pass; ``ctx.queue`` is the task's queue; ``stop_requested`` and ``cancel_requested`` stay
    False. The task's timeout is not enforced. No job row is read or written.
    """
    __tracebackhide__ = True
    limit = task.max_attempts if max_attempts is None else max_attempts
    if not 1 <= attempt <= limit:
        raise InvalidJobError(f"attempt must be from 1 to max_attempts ({limit}), not {attempt}")
    decoded = json.loads(encode_payload(payload, max_bytes=DEFAULT_MAX_PAYLOAD_BYTES))
    ctx = JobContext(
        job_id=job_id,
        task=task.name,
        queue=task.queue,
        attempt=attempt,
        max_attempts=limit,
        session=functools.partial(_handler_session, session, task.name),
    )
    try:
        if inspect.iscoroutinefunction(task.handler):
            result = asyncio.run(task.handler(ctx, decoded))
        else:
            result = task.handler(ctx, decoded)
        if ctx.session_used:
            ctx.session.flush()
    except BaseException:
        if ctx.session_used:
            ctx.session.rollback()  # to the savepoint: the handler's writes only
            ctx.session.close()
        raise
    if ctx.session_used:
        cast(HandlerSession, ctx.session).commit_for_real()  # releases the savepoint
        ctx.session.close()
        if isinstance(session, Session | scoped_session):
            session.expire_all()
    return result


def _handler_session(session: SessionLike | None, task: str) -> Session:
    """The handler's Session: a savepoint in the caller's transaction, as the worker's would be
    a transaction of its own (``commit()`` only flushes)."""
    if session is None:
        raise JobQueueError(
            f"the handler of {task!r} uses ctx.session: pass run_task(..., session=...)"
        )
    if isinstance(session, Session | scoped_session):
        session.flush()  # the handler's session is another one: let it see the caller's objects
    conn = _connection(session)
    if not conn.in_transaction():
        conn.begin()  # the caller's, left open: the savepoint needs a transaction to live in
    return HandlerSession(bind=conn, join_transaction_mode="create_savepoint")
