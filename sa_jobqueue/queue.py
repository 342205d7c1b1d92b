"""JobQueue: the task registry and the enqueue side of the queue."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, overload

from sqlalchemy import Connection, select
from sqlalchemy.engine.base import Transaction
from sqlalchemy.orm import Session, scoped_session

from . import statements
from .errors import TaskDefinitionError, UnknownTaskError
from .models import Job, jobs_table
from .tasks import Backoff, Handler, Task
from .validation import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    check_lease,
    check_max_attempts,
    check_priority,
    check_queue_name,
    check_run_at,
    check_task_name,
    encode_payload,
)

#: Queues already notified in a transaction. Keyed weakly by the innermost transaction object,
#: so the entry vanishes with it; a savepoint gets its own entry because a NOTIFY sent inside a
#: savepoint that is rolled back is dropped with it.
_notified: Final[weakref.WeakKeyDictionary[Transaction, set[str]]] = weakref.WeakKeyDictionary()

_UNSET: Final[Any] = object()


@dataclass(frozen=True)
class JobInfo:
    """A snapshot of one job row, as :meth:`JobQueue.get_job` returns it."""

    id: int
    queue: str
    task: str
    payload: Any
    status: str
    priority: int
    attempts: int
    max_attempts: int
    visible_at: datetime
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    last_error: Any
    cancel_requested: bool


class JobQueue:
    """A registry of tasks and the way to enqueue jobs for them.

    Enqueue runs in *your* transaction: pass the Session (or Connection) that writes your
    business rows, and the job exists if and only if that transaction commits. Nothing is
    committed or flushed for you, and no worker can see the job before your commit.

    A worker (``sa-jobqueue worker module:queue``) runs the tasks registered here.

    Example::

        queue = JobQueue()

        @queue.task(max_attempts=3)
        def send_welcome(ctx, payload):
            ctx.session.add(Email(user_id=payload["user_id"]))

        with Session(engine) as session, session.begin():
            session.add(user)
            queue.enqueue(session, "send_welcome", {"user_id": 42})

    What it does not promise: that a job runs exactly once. Execution is at-least-once (a
    worker can die after the work but before recording it); writes made through the handler's
    ``ctx.session`` are the exception and take effect exactly once.
    """

    def __init__(
        self,
        *,
        default_queue: str = "default",
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        self.default_queue = check_queue_name(default_queue)
        self.max_payload_bytes = max_payload_bytes
        self._tasks: dict[str, Task] = {}

    # -- registry ---------------------------------------------------------------------------

    @overload
    def task(self, fn: Handler) -> Task: ...

    @overload
    def task(
        self,
        *,
        name: str | None = None,
        queue: str | None = None,
        priority: int = 0,
        max_attempts: int = 5,
        lease: timedelta = timedelta(seconds=30),
        backoff: Backoff | None = None,
        timeout: timedelta | None = None,
    ) -> Callable[[Handler], Task]: ...

    def task(
        self,
        fn: Handler | None = None,
        *,
        name: str | None = None,
        queue: str | None = None,
        priority: int = 0,
        max_attempts: int = 5,
        lease: timedelta = timedelta(seconds=30),
        backoff: Backoff | None = None,
        timeout: timedelta | None = None,
    ) -> Task | Callable[[Handler], Task]:
        """Register a handler ``fn(ctx, payload)`` as a task (usable bare or with options).

        The task's name defaults to the function's ``__name__``; names are unique per queue
        object. ``timeout`` bounds one attempt's run time (see :class:`Task`). ``lease`` is
        how long a worker may go without renewing its claim before the
        job is taken from it and run elsewhere; the worker renews it while the handler runs.
        """

        def register(handler: Handler) -> Task:
            task = Task(
                name=name or str(getattr(handler, "__name__", "")),
                handler=handler,
                queue=queue or self.default_queue,
                priority=priority,
                max_attempts=max_attempts,
                lease=lease,
                backoff=backoff or Backoff(),
                timeout=timeout,
            )
            if task.name in self._tasks:
                raise TaskDefinitionError(f"a task named {task.name!r} is already registered")
            self._tasks[task.name] = task
            return task

        return register(fn) if fn is not None else register

    @property
    def tasks(self) -> dict[str, Task]:
        """The registered tasks by name (a copy)."""
        return dict(self._tasks)

    def get_task(self, name: str) -> Task:
        """The task registered under ``name``; UnknownTaskError if there is none."""
        try:
            return self._tasks[name]
        except KeyError:
            known = ", ".join(sorted(self._tasks)) or "none"
            raise UnknownTaskError(
                f"no task named {name!r} is registered (registered: {known})"
            ) from None

    # -- enqueue ----------------------------------------------------------------------------

    def enqueue(
        self,
        session: Session | scoped_session[Session] | Connection,
        task: str | Task,
        payload: Any = None,
        *,
        run_at: datetime | timedelta | None = None,
        priority: int | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        lease: timedelta | None = None,
    ) -> int:
        """Add one job in the caller's transaction and return its id.

        ``run_at`` is a timezone-aware datetime, or a timedelta counted from the database's
        ``now()``; by default the job is due at once. ``priority``: lower runs first. Options
        left out come from the task's declaration. Bad input raises InvalidJobError (or
        UnknownTaskError) before any SQL is sent, so the caller's transaction stays usable.
        Never commits and never flushes the session.
        """
        params, schedule = self._job_params(task, run_at, priority, queue, max_attempts, lease)
        params["payload"] = encode_payload(payload, max_bytes=self.max_payload_bytes)
        conn = _connection(session)
        sent = _sent_notifications(conn)
        wake = params["queue"] not in sent
        job_id: int = conn.execute(statements.insert_job(schedule, wake), params).scalar_one()
        sent.add(params["queue"])
        return job_id

    def enqueue_many(
        self,
        session: Session | scoped_session[Session] | Connection,
        task: str | Task,
        payloads: Iterable[Any],
        *,
        run_at: datetime | timedelta | None = None,
        priority: int | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        lease: timedelta | None = None,
    ) -> list[int]:
        """Add one job per payload, all of one task, in one statement; return their ids in order.

        Same rules as :meth:`enqueue`; every payload is checked before anything is sent, so a
        bad one rejects the whole batch and inserts nothing. One NOTIFY for the batch.
        """
        params, schedule = self._job_params(task, run_at, priority, queue, max_attempts, lease)
        encoded = [encode_payload(p, max_bytes=self.max_payload_bytes) for p in payloads]
        if not encoded:
            return []
        target = params["queue"]
        bulk = {k if k in ("run_at", "delay") else f"b_{k}": v for k, v in params.items()}
        bulk["payloads"] = encoded
        conn = _connection(session)
        ids = list(conn.execute(statements.insert_jobs(schedule), bulk).scalars())
        sent = _sent_notifications(conn)
        if target not in sent:
            conn.execute(statements.notify(), {"queue": target})
            sent.add(target)
        return ids

    def _job_params(
        self,
        task: str | Task,
        run_at: datetime | timedelta | None,
        priority: int | None,
        queue: str | None,
        max_attempts: int | None,
        lease: timedelta | None,
    ) -> tuple[dict[str, Any], str]:
        definition = task if isinstance(task, Task) else self.get_task(check_task_name(task))
        run_at = check_run_at(run_at)
        params: dict[str, Any] = {
            "task": definition.name,
            "queue": check_queue_name(queue if queue is not None else definition.queue),
            "priority": check_priority(priority if priority is not None else definition.priority),
            "max_attempts": check_max_attempts(
                max_attempts if max_attempts is not None else definition.max_attempts
            ),
            "lease": check_lease(lease if lease is not None else definition.lease).total_seconds(),
        }
        if isinstance(run_at, datetime):
            params["run_at"] = run_at
            return params, "at"
        if isinstance(run_at, timedelta):
            params["delay"] = run_at.total_seconds()
            return params, "after"
        return params, "now"

    def cancel(self, session: Session | scoped_session[Session] | Connection, job_id: int) -> bool:
        """Cancel a job in the caller's transaction; True if it was queued or running.

        A queued job becomes ``cancelled`` and never runs. For a running job, cancellation is
        requested: its handler sees ``ctx.cancel_requested`` (and ``ctx.stop_requested``)
        within one lease-renewal interval, and when the attempt ends, whether it returns or
        raises, its ``ctx.session`` writes roll back and the job ends ``cancelled``, never
        retried. Python cannot interrupt a running thread, so a sync handler that does not
        look at the flag runs to its end first. A finished job is left as it is (False).
        """
        conn = _connection(session)
        params = {"job_id": job_id}
        if conn.execute(statements.cancel_queued(), params).first() is not None:
            return True
        return conn.execute(statements.request_cancel(), params).first() is not None

    # -- inspection -------------------------------------------------------------------------

    def get_job(
        self, session: Session | scoped_session[Session] | Connection, job_id: int
    ) -> JobInfo | None:
        """Read one job as it is in the caller's transaction, or None if there is no such id."""
        row = (
            _connection(session)
            .execute(
                select(*(jobs_table.c[f] for f in _JOB_INFO_FIELDS)).where(
                    jobs_table.c.id == job_id
                )
            )
            .one_or_none()
        )
        return JobInfo(**row._asdict()) if row is not None else None

    def counts(
        self, session: Session | scoped_session[Session] | Connection
    ) -> dict[str, dict[str, int]]:
        """Job counts as ``{queue: {status: n}}``."""
        result: dict[str, dict[str, int]] = {}
        for queue, status, n in _connection(session).execute(statements.counts()):
            result.setdefault(queue, {})[status] = n
        return result


_JOB_INFO_FIELDS: Final = tuple(JobInfo.__dataclass_fields__)
assert set(_JOB_INFO_FIELDS) <= {c.name for c in Job.__table__.columns}


def _connection(session: Session | scoped_session[Session] | Connection) -> Connection:
    # Session.connection() joins the session's transaction (beginning it if needed) without
    # flushing pending objects: we add the job row and touch nothing else of the caller's.
    if isinstance(session, Session | scoped_session):
        return session.connection()
    if isinstance(session, Connection):
        return session
    raise TypeError(
        "enqueue needs a SQLAlchemy Session, scoped_session or Connection,"
        f" not {type(session).__name__}"
    )


def _sent_notifications(conn: Connection) -> set[str]:
    """The queues already notified in the connection's current (innermost) transaction."""
    txn = conn.get_nested_transaction() or conn.get_transaction()
    if txn is None:
        # Not in a transaction yet: the insert is about to autobegin one. Begin it now so the
        # bookkeeping has a transaction to hang on.
        txn = conn.begin()
    return _notified.setdefault(txn, set())
