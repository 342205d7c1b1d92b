"""Running the queue's due jobs in-process with a real worker in burst mode.

Internal to :mod:`sa_jobqueue.testing`, which exports :func:`drain` and :class:`DrainResult`;
may change without notice.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session, scoped_session

from .._binds import SessionLike
from .._payload_types import PayloadCodec
from .._registry import TaskRegistry
from .._sql import testing as testing_sql
from .._sql.clock import database_now
from .._sql.session import transaction_id_if_written
from .._validation import check_queue_name
from ..errors import InvalidJobError, JobQueueError
from ..models import CANCELLED, DEAD, QUEUED, SUCCEEDED
from ..queue import JobInfo, JobQueue
from ..tasks import Handler, JobContext, Task
from ..worker import Worker
from ._reading import JOB_FIELDS


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
        self.queue._registry = TaskRegistry(self._counted_task(t) for t in queue.tasks.values())

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

    def _counted_task(self, task: Task) -> Task:
        codec = task.payload_codec
        if codec is None:
            counted_handler = self._counted(task.handler, batch=task.batching is not None)
            return dataclasses.replace(task, handler=counted_handler)
        # A typed payload is rebuilt before the handler runs, and may not fit any more, so the
        # handler never runs: such an attempt counts from the rebuild instead.
        counted = dataclasses.replace(task)
        object.__setattr__(counted, "payload_codec", _CountedCodec(codec, self._started))
        return counted

    def _counted(self, handler: Handler, *, batch: bool) -> Handler:
        def started(payload: Any) -> None:
            # A batch task's call starts an attempt of each of its jobs.
            for _ in payload if batch else (None,):
                self._started()

        if inspect.iscoroutinefunction(handler):

            @functools.wraps(handler)
            async def counted_async(ctx: JobContext, payload: Any) -> object:
                started(payload)
                return await handler(ctx, payload)

            return counted_async

        @functools.wraps(handler)
        def counted(ctx: JobContext, payload: Any) -> object:
            started(payload)
            return handler(ctx, payload)

        return counted


class _CountedCodec(PayloadCodec):
    """A typed task's codec in a drain: it counts each attempt as it starts."""

    __slots__ = ("_started",)

    def __init__(self, codec: PayloadCodec, started: Callable[[], None]) -> None:
        super().__init__(codec.task, codec.type, codec.adapter)
        self._started = started

    def rebuild(self, data: Any) -> Any:
        self._started()
        return super().rebuild(data)


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
    rows = conn.execute(
        testing_sql.claimed_since(JOB_FIELDS), {"queues": queues, "started": started}
    )
    jobs = tuple(JobInfo(**row._asdict()) for row in rows)
    ended = [job.status for job in jobs]
    return DrainResult(
        succeeded=ended.count(SUCCEEDED),
        failed=ended.count(QUEUED),  # claimed, so failed at least once, and waiting to retry
        dead=ended.count(DEAD),
        cancelled=ended.count(CANCELLED),
        jobs=jobs,
    )


def _error_line(error: Any) -> str:
    if isinstance(error, dict):
        return f"{error.get('type')}: {error.get('message')}"
    return repr(error)
