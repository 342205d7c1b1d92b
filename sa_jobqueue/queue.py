"""JobQueue: the task registry and the enqueue side of the queue."""

from __future__ import annotations

import json
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, Literal, overload

from sqlalchemy import Connection, select
from sqlalchemy.engine.base import Transaction
from sqlalchemy.exc import MissingGreenlet, SQLAlchemyError
from sqlalchemy.orm import Session, scoped_session

from ._sql import admin as admin_sql
from ._sql import enqueue as enqueue_sql
from ._validation import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    check_lease,
    check_max_attempts,
    check_priority,
    check_queue_name,
    check_run_at,
    check_task_name,
    check_unique_key,
    encode_payload,
)
from .enqueueing import Enqueued, NewJobs, insert_many, insert_one, run_async
from .errors import InvalidJobError, TaskDefinitionError, UnknownTaskError
from .models import Job, jobs_table
from .ops import jobs as operations
from .periodic import Schedule
from .tasks import Backoff, Handler, Task

if TYPE_CHECKING:
    from .enqueueing import AsyncSessionLike

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
    unique_key: str | None = None


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

    ``tracing=True`` (needs ``opentelemetry-api``, the ``tracing`` extra) stores the current
    OpenTelemetry trace context in each job enqueued inside a span, and makes ``sa-jobqueue
    worker`` run each job in a span linked to it; see :mod:`sa_jobqueue.tracing`.
    """

    def __init__(
        self,
        *,
        default_queue: str = "default",
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        tracing: bool = False,
    ) -> None:
        self.default_queue = check_queue_name(default_queue)
        self.max_payload_bytes = max_payload_bytes
        #: Whether enqueues record the trace context (and the CLI worker traces each job).
        self.tracing = tracing
        self._trace_context: Callable[[], str | None] | None = None
        if tracing:
            # Imported only when asked for: without tracing, OpenTelemetry is never loaded.
            from .observability.tracing import current_trace_context

            self._trace_context = current_trace_context
        self._tasks: dict[str, Task] = {}
        self._schedules: dict[str, Schedule] = {}

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
        unique_key: Callable[[Any], str | None] | None = None,
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
        unique_key: Callable[[Any], str | None] | None = None,
    ) -> Task | Callable[[Handler], Task]:
        """Register a handler ``fn(ctx, payload)`` as a task (usable bare or with options).

        The task's name defaults to the function's ``__name__``; names are unique per queue
        object. ``timeout`` bounds one attempt's run time (see :class:`Task`). ``lease`` is
        how long a worker may go without renewing its claim before the
        job is taken from it and run elsewhere; the worker renews it while the handler runs.
        ``unique_key(payload)`` gives each job's unique key (see :meth:`enqueue`).
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
                unique_key=unique_key,
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

    def periodic(
        self,
        cron: str,
        *,
        timezone: str = "UTC",
        payload: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> Callable[[Task | Handler], Task]:
        """Run a task on a cron schedule, e.g. ``@queue.periodic("*/5 * * * *")``.

        Stack it over ``@queue.task(...)``, or put it on a bare handler to register that with
        the task defaults; stack several (each with its own ``name``) for several schedules.
        ``timezone`` is an IANA name; ``payload`` a dict, to which each job adds ``"tick"``.
        The schedule's ``name`` (default: the task's) is its identity in the database.
        Workers enqueue due ticks with :func:`sa_jobqueue.periodic.enqueue_due`; see that
        module for what happens to missed ticks, new schedules and daylight saving time.
        """

        def register(target: Task | Handler) -> Task:
            registered_here = not isinstance(target, Task)
            task = target if isinstance(target, Task) else self.task(target)
            if self._tasks.get(task.name) is not task:
                raise TaskDefinitionError(f"task {task.name!r} is not registered with this queue")
            try:
                schedule = Schedule(
                    name=task.name if name is None else name,
                    task=task,
                    cron=cron,
                    timezone=timezone,
                    payload={} if payload is None else payload,
                )
                if schedule.name in self._schedules:
                    raise TaskDefinitionError(
                        f"a schedule named {schedule.name!r} is already declared: give this"
                        " one a name=... of its own"
                    )
            except TaskDefinitionError:
                if registered_here:
                    del self._tasks[task.name]
                raise
            self._schedules[schedule.name] = schedule
            return task

        return register

    @property
    def schedules(self) -> dict[str, Schedule]:
        """The declared periodic schedules by name (a copy)."""
        return dict(self._schedules)

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
        backoff: Backoff | None = None,
        unique_key: str | None = None,
    ) -> Enqueued:
        """Add one job in the caller's transaction and return its id (an :class:`Enqueued`).

        ``run_at`` is a timezone-aware datetime, or a timedelta counted from the database's
        ``now()``; by default the job is due at once. ``priority``: lower runs first. Options
        left out come from the task's declaration (``backoff`` too: given here, it is kept
        with the job and used for its retries instead of the task's). Bad input raises
        InvalidJobError (or UnknownTaskError) before any SQL is sent, so the caller's
        transaction stays usable. Never commits and never flushes the session.

        ``unique_key`` (default: the task's ``unique_key(payload)``, if it declares one): while
        a queued or running job of the same task holds this key, nothing is added and the
        returned id is that job's, with ``.created`` False. The other job's payload and options
        stay as they are. A job that has finished (succeeded, dead, cancelled) holds no key.
        Under REPEATABLE READ or SERIALIZABLE, a key taken by a transaction that committed
        after yours began raises a serialization error instead (retry the transaction).
        """
        new = self._new_jobs(
            task, [payload], run_at, priority, queue, max_attempts, lease, [unique_key], backoff
        )
        conn = _connection(session)
        return insert_one(conn, new, _sent_notifications(conn))

    async def aenqueue(
        self,
        session: AsyncSessionLike,
        task: str | Task,
        payload: Any = None,
        *,
        run_at: datetime | timedelta | None = None,
        priority: int | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        lease: timedelta | None = None,
        backoff: Backoff | None = None,
        unique_key: str | None = None,
    ) -> Enqueued:
        """:meth:`enqueue` for an ``AsyncSession`` or ``AsyncConnection``; same guarantees.

        The job is written in the async session's transaction and exists if and only if that
        commits; bad input raises before any SQL is sent.
        """
        new = self._new_jobs(
            task, [payload], run_at, priority, queue, max_attempts, lease, [unique_key], backoff
        )
        return await run_async(
            session, lambda conn: insert_one(conn, new, _sent_notifications(conn))
        )

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
        backoff: Backoff | None = None,
        unique_keys: Sequence[str | None] | None = None,
    ) -> list[Enqueued]:
        """Add one job per payload, all of one task, in one statement; return their ids in order.

        Same rules as :meth:`enqueue`; every payload is checked before anything is sent, so a
        bad one rejects the whole batch and inserts nothing. One NOTIFY for the batch.

        ``unique_keys``: one key per payload, as ``unique_key`` of :meth:`enqueue` (a None
        entry, or no list, leaves the key to the task's ``unique_key`` function). A payload
        whose key a live job holds gets that job's id (``.created`` False), and so does a later
        payload of the batch with the same key as an earlier one: it gets the earlier one's job.
        """
        items = list(payloads)
        keys = [None] * len(items) if unique_keys is None else list(unique_keys)
        new = self._new_jobs(
            task, items, run_at, priority, queue, max_attempts, lease, keys, backoff
        )
        if not items:
            return []
        conn = _connection(session)
        return insert_many(conn, new, _sent_notifications(conn))

    async def aenqueue_many(
        self,
        session: AsyncSessionLike,
        task: str | Task,
        payloads: Iterable[Any],
        *,
        run_at: datetime | timedelta | None = None,
        priority: int | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        lease: timedelta | None = None,
        backoff: Backoff | None = None,
        unique_keys: Sequence[str | None] | None = None,
    ) -> list[Enqueued]:
        """:meth:`enqueue_many` for an ``AsyncSession`` or ``AsyncConnection``; same guarantees."""
        items = list(payloads)
        keys = [None] * len(items) if unique_keys is None else list(unique_keys)
        new = self._new_jobs(
            task, items, run_at, priority, queue, max_attempts, lease, keys, backoff
        )
        if not items:
            return []
        return await run_async(
            session, lambda conn: insert_many(conn, new, _sent_notifications(conn))
        )

    def _new_jobs(
        self,
        task: str | Task,
        payloads: list[Any],
        run_at: datetime | timedelta | None,
        priority: int | None,
        queue: str | None,
        max_attempts: int | None,
        lease: timedelta | None,
        unique_keys: Sequence[str | None],
        backoff: Backoff | None = None,
    ) -> NewJobs:
        """Check and encode everything enqueue was given; no I/O.

        ``unique_keys`` is parallel to ``payloads``; for a None entry the task's function, if
        it has one, gives the key.
        """
        params, schedule = self._job_params(task, run_at, priority, queue, max_attempts, lease)
        definition = task if isinstance(task, Task) else self.get_task(params["task"])
        encoded = [encode_payload(p, max_bytes=self.max_payload_bytes) for p in payloads]
        if len(unique_keys) != len(payloads):
            raise InvalidJobError(
                f"unique_keys has {len(unique_keys)} entries for {len(payloads)} payloads"
            )
        derive = definition.unique_key
        keys = [
            check_unique_key(
                key if key is not None or derive is None else derive(payload),
                task=definition.name,
            )
            for payload, key in zip(payloads, unique_keys, strict=True)
        ]
        # Taken here, before any I/O and in the caller's thread or task: the span that is
        # current where enqueue was called is the one the job's run will point back to.
        trace = self._trace_context() if self._trace_context is not None else None
        if backoff is not None and not isinstance(backoff, Backoff):
            raise InvalidJobError(f"backoff must be a Backoff, not {type(backoff).__name__}")
        policy = None if backoff is None else json.dumps(backoff.to_json())
        return NewJobs(params, schedule, encoded, keys, trace, policy)

    def _job_params(
        self,
        task: str | Task,
        run_at: datetime | timedelta | None,
        priority: int | None,
        queue: str | None,
        max_attempts: int | None,
        lease: timedelta | None,
    ) -> tuple[dict[str, Any], str]:
        if callable(task) and not isinstance(task, Task):
            # A function passed as the task (print, or a handler whose Task was not kept):
            # a TypeError saying what to pass. Anything else is taken for a name, and a bad
            # one is an InvalidNameError as ever.
            raise TypeError(self._not_a_task(task))
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

    def _not_a_task(self, task: object) -> str:
        """What enqueue says when given something that is neither a Task nor a name."""
        message = (
            "enqueue takes a registered task (the Task that @queue.task returned) or a task"
            f" name string, not {task!r} ({type(task).__name__})"
        )
        named = [t.name for t in self._tasks.values() if t.handler is task]
        if named:
            message += f"; it is the handler of task {named[0]!r}: pass that name instead"
        return message

    def cancel(self, session: Session | scoped_session[Session] | Connection, job_id: int) -> bool:
        """Cancel a job in the caller's transaction; True if it was queued or running.

        A queued job becomes ``cancelled`` and never runs. For a running job, cancellation is
        requested: its handler sees ``ctx.cancel_requested`` (and ``ctx.stop_requested``)
        within one lease-renewal interval, and when the attempt ends, whether it returns or
        raises, its ``ctx.session`` writes roll back and the job ends ``cancelled``, never
        retried. Python cannot interrupt a running thread, so a sync handler that does not
        look at the flag runs to its end first. A finished job is left as it is (False).
        """
        return _cancel(_connection(session), job_id)

    async def acancel(self, session: AsyncSessionLike, job_id: int) -> bool:
        """:meth:`cancel` for an ``AsyncSession`` or ``AsyncConnection``."""
        return await run_async(session, lambda conn: _cancel(conn, job_id))

    def requeue(
        self,
        session: Session | scoped_session[Session] | Connection,
        job_id: int,
        *,
        attempts: Literal["extend", "reset"] = "extend",
    ) -> bool:
        """Put a ``dead`` job back in its queue, due now, in the caller's transaction.

        True if the job was dead and is queued again; False (nothing changed) if it is not
        dead, does not exist, or its unique key is now held by another queued or running job
        of its task. ``finished_at`` is cleared; ``last_error`` is kept until the next attempt
        records its own outcome. Never commits; one NOTIFY wakes the queue's workers at commit.

        ``attempts="extend"`` (the default) keeps the attempts already made and raises
        ``max_attempts`` by its current value: a job that used up 5 of 5 may run 5 more times
        (10 of 10). A job requeued again starts from its raised limit, so each requeue grants
        as many attempts as the job's limit was. Attempt numbers keep rising, and they are the
        fencing tokens: an attempt from before the requeue that is somehow still running (its
        worker froze past the lease) can never complete the job's new attempts.

        ``attempts="reset"`` sets ``attempts`` back to 0 and keeps ``max_attempts``. The
        attempt numbers are reused, which gives up that fencing: use it only when no earlier
        attempt of the job can still be running.
        """
        if attempts not in ("extend", "reset"):
            raise InvalidJobError(f"attempts must be 'extend' or 'reset', not {attempts!r}")
        conn = _connection(session)
        queue = conn.execute(
            operations.requeue_dead(attempts == "reset"), {"job_id": job_id}
        ).scalar_one_or_none()
        if queue is None:
            return False
        sent = _sent_notifications(conn)
        if queue not in sent:
            conn.execute(enqueue_sql.notify(), {"queue": queue})
            sent.add(queue)
        return True

    # -- inspection -------------------------------------------------------------------------

    def get_job(
        self, session: Session | scoped_session[Session] | Connection, job_id: int
    ) -> JobInfo | None:
        """Read one job as it is in the caller's transaction, or None if there is no such id."""
        return _get_job(_connection(session), job_id)

    async def aget_job(self, session: AsyncSessionLike, job_id: int) -> JobInfo | None:
        """:meth:`get_job` for an ``AsyncSession`` or ``AsyncConnection``."""
        return await run_async(session, lambda conn: _get_job(conn, job_id))

    def list_jobs(
        self,
        session: Session | scoped_session[Session] | Connection,
        *,
        queue: str | None = None,
        status: str | Iterable[str] | None = None,
        task: str | None = None,
        older_than: timedelta | None = None,
        limit: int = 100,
        after_id: int | None = None,
        newest_first: bool = False,
    ) -> list[JobInfo]:
        """Read up to ``limit`` jobs in id order (oldest first), in the caller's transaction.

        Filters: ``queue``, ``task``, ``status`` (one status or several), and ``older_than``
        (created longer ago than that, by the database's clock). For the next page, pass the
        last id you got as ``after_id`` (keyset pagination: stable while rows come and go,
        and as cheap for the thousandth page as for the first). Bad filters raise
        InvalidJobError before any SQL is sent. ``limit`` is at most 10,000.

        ``newest_first`` reads the highest ids first, and ``after_id`` then means the jobs
        with lower ids: the next page goes on in the same direction. Ids are handed out in
        insert order, so this is the order jobs were enqueued in, not ``created_at``'s order
        (a transaction's jobs take their creation time from its start).
        """
        params: dict[str, Any] = {"limit": operations.check_limit(limit)}
        if status is not None:
            params["statuses"] = operations.check_statuses(status)
        if queue is not None:
            params["queue"] = check_queue_name(queue)
        if task is not None:
            params["task"] = check_task_name(task)
        if older_than is not None:
            params["older_than"] = operations.check_age(older_than)
        if after_id is not None:
            if isinstance(after_id, bool) or not isinstance(after_id, int):
                raise InvalidJobError(f"after_id must be a job id (an int), not {after_id!r}")
            params["after_id"] = after_id
        statement = operations.select_jobs(
            _JOB_INFO_FIELDS,
            statuses=status is not None,
            queue=queue is not None,
            task=task is not None,
            older_than=older_than is not None,
            after=after_id is not None,
            newest_first=bool(newest_first),
        )
        rows = _connection(session).execute(statement, params)
        return [JobInfo(**row._asdict()) for row in rows]

    def counts(
        self, session: Session | scoped_session[Session] | Connection
    ) -> dict[str, dict[str, int]]:
        """Job counts as ``{queue: {status: n}}``."""
        result: dict[str, dict[str, int]] = {}
        for queue, status, n in _connection(session).execute(admin_sql.counts()):
            result.setdefault(queue, {})[status] = n
        return result


_JOB_INFO_FIELDS: Final = tuple(JobInfo.__dataclass_fields__)
assert set(_JOB_INFO_FIELDS) <= {c.name for c in Job.__table__.columns}


def _cancel(conn: Connection, job_id: int) -> bool:
    params = {"job_id": job_id}
    if conn.execute(admin_sql.cancel_queued(), params).first() is not None:
        return True
    return conn.execute(admin_sql.request_cancel(), params).first() is not None


def _get_job(conn: Connection, job_id: int) -> JobInfo | None:
    row = conn.execute(
        select(*(jobs_table.c[f] for f in _JOB_INFO_FIELDS)).where(jobs_table.c.id == job_id)
    ).one_or_none()
    return JobInfo(**row._asdict()) if row is not None else None


def _connection(session: Session | scoped_session[Session] | Connection) -> Connection:
    # Session.connection() joins the session's transaction (beginning it if needed) without
    # flushing pending objects: we add the job row and touch nothing else of the caller's.
    if isinstance(session, Session | scoped_session):
        try:
            bind: object = session.get_bind()
        except SQLAlchemyError:
            bind = None  # no single bind to look at: connection() says what is wrong
        # An asyncio driver works only inside SQLAlchemy's greenlet bridge (the Session that
        # AsyncSession.run_sync hands over); outside it, refuse before connecting, which
        # would fail deep in SQLAlchemy and leave a never-awaited coroutine behind.
        if type(bind).__module__.startswith("sqlalchemy.ext.asyncio") or (
            getattr(getattr(bind, "dialect", None), "is_async", False) and _outside_bridge()
        ):
            raise TypeError(_ASYNC_BIND)
        try:
            return session.connection()
        except MissingGreenlet as exc:  # _outside_bridge could not tell
            raise TypeError(_ASYNC_BIND) from exc
    if isinstance(session, Connection):
        return session
    hint = ""
    if type(session).__module__.startswith("sqlalchemy.ext.asyncio"):
        hint = " (for an AsyncSession or AsyncConnection, await aenqueue, acancel, ...)"
    raise TypeError(
        "enqueue needs a SQLAlchemy Session, scoped_session or Connection,"
        f" not {type(session).__name__}{hint}"
    )


def _outside_bridge() -> bool:
    """True when surely not running inside SQLAlchemy's greenlet bridge; False if unsure."""
    # sqlalchemy.util is not public API: if in_greenlet moves, say "unsure" and let the
    # connection attempt tell instead.
    from sqlalchemy.util import concurrency

    in_greenlet = getattr(concurrency, "in_greenlet", None)
    return in_greenlet is not None and not in_greenlet()


_ASYNC_BIND: Final = (
    "this Session is bound to an async engine (an asyncio driver), which sync code cannot"
    " use: enqueue through an AsyncSession with await aenqueue (acancel, aget_job, ...)"
)


def _sent_notifications(conn: Connection) -> set[str]:
    """The queues already notified in the connection's current (innermost) transaction."""
    txn = conn.get_nested_transaction() or conn.get_transaction()
    if txn is None:
        # Not in a transaction yet: the insert is about to autobegin one. Begin it now so the
        # bookkeeping has a transaction to hang on.
        txn = conn.begin()
    return _notified.setdefault(txn, set())
