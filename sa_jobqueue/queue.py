"""JobQueue: the face of the queue. Declare tasks, enqueue jobs, look after them.

The work is done underneath: the task registry in :mod:`sa_jobqueue._registry`, enqueueing
in the :mod:`sa_jobqueue._enqueue` wing (its :class:`~sa_jobqueue._enqueue.enqueuer.Enqueuer`
prepares each call; the methods here run the work it returns in the caller's transaction, or in
one of its own for an Engine), the methods for enqueued jobs in the base
:class:`~sa_jobqueue._job_admin.JobAdmin`, which delegates to :mod:`sa_jobqueue.ops.admin` and
:mod:`sa_jobqueue.results`, and those that enqueue workflows in the base
:class:`~sa_jobqueue._queue_workflows.WorkflowMethods`. The enqueue options are defined once,
in :class:`JobOptions`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Unpack, cast, overload

from ._backoff import Backoff
from ._binds import SessionLike
from ._enqueue import Enqueued, EnqueueManyOptions, EnqueueOptions, JobOptions
from ._enqueue.enqueuer import Enqueuer
from ._enqueue.transactions import arun_in, run_in
from ._job_admin import JobAdmin
from ._payloads import DEFAULT_MAX_PAYLOAD_BYTES
from ._queue_workflows import WorkflowMethods
from ._registry import TaskRegistry, handler_name
from ._validation import UniqueMode, check_queue_name
from .batching import BatchContext, Batching, BatchJob
from .errors import TaskDefinitionError
from .middleware import Middleware
from .ops.admin import JobInfo
from .periodic import Schedule
from .results import JobResult
from .tasks import Handler, JobContext, P, Task

if TYPE_CHECKING:
    from sqlalchemy import Engine
    from sqlalchemy.ext.asyncio import AsyncEngine

    from ._binds import AsyncSessionLike

__all__ = [
    "EnqueueManyOptions",
    "EnqueueOptions",
    "Enqueued",
    "JobInfo",
    "JobOptions",
    "JobQueue",
    "JobResult",
]


class JobQueue(JobAdmin, WorkflowMethods):
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

    ``middleware``: :class:`~sa_jobqueue.middleware.Middleware` objects run around every
    enqueue (in the caller's transaction) and every attempt (inside it); see
    :mod:`sa_jobqueue.middleware`.

    ``tracing=True`` (needs ``opentelemetry-api``, the ``tracing`` extra) stores the current
    OpenTelemetry trace context in each job enqueued inside a span, and makes ``sa-jobqueue
    worker`` run each job in a span linked to it; see :mod:`sa_jobqueue.observability.tracing`.
    """

    def __init__(
        self,
        *,
        default_queue: str = "default",
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        tracing: bool = False,
        middleware: Sequence[Middleware] = (),
    ) -> None:
        self.default_queue = check_queue_name(default_queue)
        if not all(isinstance(layer, Middleware) for layer in middleware):
            raise TaskDefinitionError("middleware must be Middleware objects (subclass it)")
        #: Whether enqueues record the trace context (and the CLI worker traces each job).
        self.tracing = tracing
        trace_context: Callable[[], str | None] | None = None
        if tracing:
            # Imported only when asked for: without tracing, OpenTelemetry is never loaded.
            from .observability.tracing import current_trace_context

            trace_context = current_trace_context
        self._registry = TaskRegistry()
        self._enqueuer = Enqueuer(
            self._registry,
            middleware=middleware,
            max_payload_bytes=max_payload_bytes,
            trace_context=trace_context,
        )

    @property
    def middleware(self) -> tuple[Middleware, ...]:
        """Around every enqueue and every attempt, the first outermost (see
        :mod:`sa_jobqueue.middleware`)."""
        return self._enqueuer.middleware

    @property
    def max_payload_bytes(self) -> int:
        """The largest payload an enqueue accepts, in bytes of its JSON text."""
        return self._enqueuer.max_payload_bytes

    # -- registry ---------------------------------------------------------------------------

    @overload
    def task(self, fn: Callable[[JobContext, P], object]) -> Task[P]: ...

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
        unique_mode: UniqueMode = "skip",
        unique_period: timedelta | None = None,
        debounce: timedelta | None = None,
        keep_result: bool = False,
        hard_timeout: timedelta | None = None,
        tags: Sequence[str] = (),
        meta: Mapping[str, Any] | None = None,
        on_error: Task | None = None,
    ) -> Callable[[Callable[[JobContext, P], object]], Task[P]]: ...

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
        unique_mode: UniqueMode = "skip",
        unique_period: timedelta | None = None,
        debounce: timedelta | None = None,
        keep_result: bool = False,
        hard_timeout: timedelta | None = None,
        tags: Sequence[str] = (),
        meta: Mapping[str, Any] | None = None,
        on_error: Task | None = None,
    ) -> Task | Callable[[Handler], Task]:
        """Register a handler ``fn(ctx, payload)`` as a task (usable bare or with options).

        The task's name defaults to the function's ``__name__``; names are unique per queue
        object. ``timeout`` bounds one attempt's run time, and ``hard_timeout`` kills an
        attempt that runs that long, in a child process (see :class:`Task`). ``lease`` is
        how long a worker may go without renewing its claim before the
        job is taken from it and run elsewhere; the worker renews it while the handler runs.
        ``unique_key(payload)`` gives each job's unique key (see :meth:`enqueue`);
        ``unique_mode`` says what an enqueue whose key is held does (``"skip"``, ``"replace"``
        or ``"debounce"``), ``debounce`` is the delay a debounced job is due after when the
        enqueue names no ``run_at``, and ``unique_period`` holds a key for the rest of the
        fixed window of that length its job was enqueued in, even once the job has finished.
        ``keep_result`` stores what the handler returns with the job's completion (see
        :meth:`get_result` and :meth:`wait_for_result`). ``tags`` and ``meta`` are kept with
        every job of the task (an enqueue's tags are added to them, its meta's keys go over
        them; see :meth:`enqueue`). ``on_error`` is the error callback: a task (declared
        before this one) of which each death of a job of this task enqueues a job, in the
        statement that moves it to dead (see "Error callbacks" in the tasks how-to). Bad
        options raise TaskDefinitionError here.

        A handler whose payload parameter is annotated with a dataclass, a ``TypedDict`` or a
        Pydantic model takes a typed payload (see :class:`Task`); the task is a ``Task[T]`` of
        that type ``T``, so a type checker checks what :meth:`enqueue` is given for it.
        """

        def register(handler: Handler) -> Task:
            task = Task(
                name=name or handler_name(handler),
                handler=handler,
                queue=queue or self.default_queue,
                priority=priority,
                max_attempts=max_attempts,
                lease=lease,
                backoff=Backoff() if backoff is None else backoff,
                timeout=timeout,
                unique_key=unique_key,
                unique_mode=unique_mode,
                unique_period=unique_period,
                debounce=debounce,
                keep_result=keep_result,
                hard_timeout=hard_timeout,
                tags=cast(tuple[str, ...], tags),
                meta=None if meta is None else dict(meta),
                on_error=on_error,
            )
            return self._registry.add(task)

        return register(fn) if fn is not None else register

    def batch_task(
        self,
        *,
        max_size: int = 100,
        max_wait: timedelta = timedelta(milliseconds=200),
        batch_key: str | None = None,
        name: str | None = None,
        queue: str | None = None,
        priority: int = 0,
        max_attempts: int = 5,
        lease: timedelta = timedelta(seconds=30),
        backoff: Backoff | None = None,
        timeout: timedelta | None = None,
        unique_key: Callable[[Any], str | None] | None = None,
        unique_mode: UniqueMode = "skip",
        unique_period: timedelta | None = None,
        debounce: timedelta | None = None,
        keep_result: bool = False,
        tags: Sequence[str] = (),
        meta: Mapping[str, Any] | None = None,
    ) -> Callable[[Callable[[BatchContext, list[BatchJob[P]]], object]], Task[P]]:
        """Register a handler ``fn(ctx, jobs)`` that takes its jobs in batches (see
        :mod:`sa_jobqueue.batching`).

        Jobs are enqueued one per payload, as for any task. A worker hands the handler up to
        ``max_size`` of them at once, waiting up to ``max_wait`` for a batch to fill; with
        ``batch_key`` (a top-level payload field), a batch holds only jobs with the same value
        of it. The other options are :meth:`task`'s, and apply to each job of a batch
        (``timeout`` to the batch's run). With ``keep_result``, the handler returns one result
        per job, in the order of ``jobs``. TaskDefinitionError for bad options; ``max_wait``
        must be at most a third of ``lease``.
        """

        def register(handler: Callable[[BatchContext, list[BatchJob[P]]], object]) -> Task[P]:
            task = Task(
                name=name or handler_name(cast(Handler, handler)),
                handler=cast(Handler, handler),
                queue=queue or self.default_queue,
                priority=priority,
                max_attempts=max_attempts,
                lease=lease,
                backoff=Backoff() if backoff is None else backoff,
                timeout=timeout,
                unique_key=unique_key,
                unique_mode=unique_mode,
                unique_period=unique_period,
                debounce=debounce,
                keep_result=keep_result,
                tags=cast(tuple[str, ...], tags),
                meta=None if meta is None else dict(meta),
                batching=Batching(max_size, max_wait, batch_key),
            )
            return cast(Task[P], self._registry.add(task))

        return register

    @property
    def tasks(self) -> dict[str, Task]:
        """The registered tasks by name (a copy)."""
        return self._registry.tasks

    def get_task(self, name: str) -> Task:
        """The task registered under ``name``; UnknownTaskError if there is none."""
        return self._registry.get(name)

    def periodic(
        self,
        cron: str,
        *,
        timezone: str = "UTC",
        payload: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> Callable[[Task[P] | Callable[[JobContext, P], object]], Task[P]]:
        """Run a task on a cron schedule, e.g. ``@queue.periodic("*/5 * * * *")``.

        Stack it over ``@queue.task(...)``, or put it on a bare handler to register that with
        the task defaults; stack several (each with its own ``name``) for several schedules.
        ``timezone`` is an IANA name; ``payload`` a dict, to which each job adds ``"tick"``.
        The schedule's ``name`` (default: the task's) is its identity in the database.
        Workers enqueue due ticks with :func:`sa_jobqueue.periodic.enqueue_due`; see that
        module for what happens to missed ticks, new schedules and daylight saving time.
        """

        def register(target: Task[P] | Callable[[JobContext, P], object]) -> Task[P]:
            added = not isinstance(target, Task)
            task = target if isinstance(target, Task) else self.task(target)
            self._registry.add_schedule(
                task,
                cron=cron,
                timezone=timezone,
                payload=payload,
                name=name,
                task_added_for_it=added,
            )
            return task

        return register

    @property
    def schedules(self) -> dict[str, Schedule]:
        """The declared periodic schedules by name (a copy)."""
        return self._registry.schedules

    # -- enqueue: see sa_jobqueue._enqueue ----------------------------------------------------

    def enqueue(
        self,
        session: SessionLike | Engine,
        task: str | Task[P],
        payload: P | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> Enqueued:
        """Add one job in the caller's transaction and return its id (an :class:`Enqueued`).

        ``options`` are those of :class:`~sa_jobqueue.queue.EnqueueOptions`: the
        :class:`~sa_jobqueue.queue.JobOptions` (``run_at``, ``priority``, ``queue``,
        ``max_attempts``, ``lease``, ``backoff``, ``unique_mode``, ``unique_period``, ``tags``,
        ``meta``), each left to the task's declaration when left out (``tags`` are added to
        the task's, ``meta``'s keys go over the task's), and ``unique_key`` and
        ``depends_on``.
        Bad input raises InvalidJobError (or UnknownTaskError) before any SQL is sent, so the
        caller's transaction stays usable; an unknown option name raises TypeError. Never
        commits and never flushes the session.

        Given an ``Engine`` instead, the job joins no business transaction: it is inserted in
        a transaction of its own, committed before this returns, and that transaction is tried
        again (three tries in all) when it fails on a transient error, a lost connection above
        all. A failed transaction added nothing, with one exception: a connection lost after
        the COMMIT was sent and before its reply came may leave the job committed, and the
        retry then adds it again, unless a unique key lets the retry find it instead.
        """
        return run_in(session, self._enqueuer.one(task, payload, options))[0]

    async def aenqueue(
        self,
        session: AsyncSessionLike | AsyncEngine,
        task: str | Task[P],
        payload: P | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> Enqueued:
        """:meth:`enqueue` for an ``AsyncSession``, ``AsyncConnection`` or ``AsyncEngine``;
        same guarantees, the same work run on the sync Connection behind it."""
        return (await arun_in(session, self._enqueuer.one(task, payload, options)))[0]

    def enqueue_many(
        self,
        session: SessionLike | Engine,
        task: str | Task[P],
        payloads: Iterable[P],
        **options: Unpack[EnqueueManyOptions],
    ) -> list[Enqueued]:
        """Add one job per payload, all of one task, in one go; return their ids in order.

        Same rules as :meth:`enqueue` (an ``Engine`` too), with the options of
        :class:`~sa_jobqueue.queue.EnqueueManyOptions` (``unique_keys``: one per payload);
        every payload is checked before anything is sent, so a bad one rejects the whole
        batch and inserts nothing. One NOTIFY for the batch. Fewer than 200 jobs, or jobs with
        unique keys, go in by one INSERT; more by COPY on the session's connection, in its
        transaction, after one statement that draws their ids. SQLAlchemy's cursor events see
        that statement, not the COPY.
        """
        work = self._enqueuer.many(task, payloads, options)
        return [] if work is None else run_in(session, work)

    async def aenqueue_many(
        self,
        session: AsyncSessionLike | AsyncEngine,
        task: str | Task[P],
        payloads: Iterable[P],
        **options: Unpack[EnqueueManyOptions],
    ) -> list[Enqueued]:
        """:meth:`enqueue_many` for an ``AsyncSession``, ``AsyncConnection`` or
        ``AsyncEngine``; same guarantees."""
        work = self._enqueuer.many(task, payloads, options)
        return [] if work is None else await arun_in(session, work)
