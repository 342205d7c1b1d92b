"""JobQueue: the face of the queue. Declare tasks, enqueue jobs, look after them.

The work is done underneath: the task registry in :mod:`sa_jobqueue._registry`, enqueueing
in :mod:`sa_jobqueue._enqueue` (one option resolver for every enqueue path), and job admin in
:mod:`sa_jobqueue.ops.admin`, which the admin methods here delegate to.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, overload

from . import results
from ._binds import SessionLike, connection_of, run_async
from ._enqueue import (
    Enqueued,
    EnqueueOptions,
    NewJobs,
    insert_many,
    insert_one,
    new_jobs,
    resolve_options,
)
from ._registry import TaskRegistry, handler_name
from ._validation import DEFAULT_MAX_PAYLOAD_BYTES, UniqueMode, check_queue_name
from .errors import TaskDefinitionError
from .middleware import Enqueueing, Middleware, enqueue_chain
from .ops import admin
from .ops.admin import JobInfo
from .periodic import Schedule
from .results import JobResult
from .tasks import Backoff, Handler, JobContext, P, Task
from .workflows import (
    Call,
    Dependency,
    OnFailure,
    check_call_options,
    check_dependencies,
    enqueue_with,
)

if TYPE_CHECKING:
    from sqlalchemy import Connection, Engine
    from sqlalchemy.ext.asyncio import AsyncEngine

    from ._binds import AsyncSessionLike

__all__ = ["Enqueued", "JobInfo", "JobQueue", "JobResult"]


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

    ``middleware``: :class:`~sa_jobqueue.middleware.Middleware` objects run around every
    enqueue (in the caller's transaction) and every attempt (inside it); see
    :mod:`sa_jobqueue.middleware`.

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
        middleware: Sequence[Middleware] = (),
    ) -> None:
        self.default_queue = check_queue_name(default_queue)
        if not all(isinstance(layer, Middleware) for layer in middleware):
            raise TaskDefinitionError("middleware must be Middleware objects (subclass it)")
        #: Around every enqueue and every attempt, the first outermost (see
        #: :mod:`sa_jobqueue.middleware`).
        self.middleware: tuple[Middleware, ...] = tuple(middleware)
        self.max_payload_bytes = max_payload_bytes
        #: Whether enqueues record the trace context (and the CLI worker traces each job).
        self.tracing = tracing
        self._trace_context: Callable[[], str | None] | None = None
        if tracing:
            # Imported only when asked for: without tracing, OpenTelemetry is never loaded.
            from .observability.tracing import current_trace_context

            self._trace_context = current_trace_context
        self._registry = TaskRegistry()
        #: Each task's options when enqueue overrides none, resolved once (a Task is frozen).
        self._defaults: dict[str, EnqueueOptions] = {}

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
    ) -> Task | Callable[[Handler], Task]:
        """Register a handler ``fn(ctx, payload)`` as a task (usable bare or with options).

        The task's name defaults to the function's ``__name__``; names are unique per queue
        object. ``timeout`` bounds one attempt's run time (see :class:`Task`). ``lease`` is
        how long a worker may go without renewing its claim before the
        job is taken from it and run elsewhere; the worker renews it while the handler runs.
        ``unique_key(payload)`` gives each job's unique key (see :meth:`enqueue`);
        ``unique_mode`` says what an enqueue whose key is held does (``"skip"``, ``"replace"``
        or ``"debounce"``), ``debounce`` is the delay a debounced job is due after when the
        enqueue names no ``run_at``, and ``unique_period`` holds a key for the rest of the
        fixed window of that length its job was enqueued in, even once the job has finished.
        ``keep_result`` stores what the handler returns with the job's completion (see
        :meth:`get_result` and :meth:`wait_for_result`). Bad options raise
        TaskDefinitionError here.

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
            )
            return self._registry.add(task)

        return register(fn) if fn is not None else register

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

    # -- enqueue ----------------------------------------------------------------------------

    def enqueue(
        self,
        session: SessionLike,
        task: str | Task[P],
        payload: P | None = None,
        *,
        run_at: datetime | timedelta | None = None,
        priority: int | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        lease: timedelta | None = None,
        backoff: Backoff | None = None,
        unique_key: str | None = None,
        unique_mode: UniqueMode | None = None,
        unique_period: timedelta | None = None,
        depends_on: Sequence[int | Dependency] | None = None,
    ) -> Enqueued:
        """Add one job in the caller's transaction and return its id (an :class:`Enqueued`).

        ``run_at`` is a timezone-aware datetime, or a timedelta counted from the database's
        ``now()``; by default the job is due at once. ``priority``: lower runs first. Options
        left out come from the task's declaration (``backoff`` too: given here, it is kept
        with the job and used for its retries instead of the task's). Bad input raises
        InvalidJobError (or UnknownTaskError) before any SQL is sent, so the caller's
        transaction stays usable. Never commits and never flushes the session.

        ``unique_key`` (default: the task's ``unique_key(payload)``, if it declares one): while
        a waiting, queued or running job of the same task holds this key, nothing is added and
        the returned id is that job's, with ``.created`` False. What happens to that job is the
        ``unique_mode`` (default: the task's): ``"skip"`` leaves it as it is; ``"replace"``
        gives it, if it is queued, this call's payload, priority and due time; ``"debounce"``
        does the same but never moves its due time earlier. Then ``.updated`` is True. A
        waiting or running job is never changed. A job that has finished (succeeded, dead,
        cancelled) holds no key, unless a ``unique_period`` (default: the task's) holds it for the
        rest of the window its job was enqueued in. Under REPEATABLE READ or SERIALIZABLE, a key
        taken by a transaction that committed after yours began raises a serialization error
        instead (retry the transaction). See the unique jobs how-to for the whole story.

        ``depends_on``: job ids (or :class:`~sa_jobqueue.workflows.Dependency` edges) the job
        waits for: it is ``waiting`` until they have all ended, then runs; one that ends dead
        or cancelled cancels it unless its edge says ``on_failure="run"``. An id with no job
        raises UnknownJobError before the job is inserted. Under REPEATABLE READ or
        SERIALIZABLE, a dependency that changed after your transaction's snapshot raises a
        serialization error, at the enqueue or at commit: retry the transaction. See
        :mod:`sa_jobqueue.workflows`.
        """
        options = _given(
            run_at=run_at,
            priority=priority,
            queue=queue,
            max_attempts=max_attempts,
            lease=lease,
            backoff=backoff,
            unique_mode=unique_mode,
            unique_period=unique_period,
        )
        keys = None if unique_key is None else [unique_key]
        edges = check_dependencies(depends_on)
        enqueue = self._enqueuer(task, [payload], keys, options, _insert_one, edges)
        return enqueue(connection_of(session))[0]

    async def aenqueue(
        self,
        session: AsyncSessionLike,
        task: str | Task[P],
        payload: P | None = None,
        *,
        run_at: datetime | timedelta | None = None,
        priority: int | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        lease: timedelta | None = None,
        backoff: Backoff | None = None,
        unique_key: str | None = None,
        unique_mode: UniqueMode | None = None,
        unique_period: timedelta | None = None,
        depends_on: Sequence[int | Dependency] | None = None,
    ) -> Enqueued:
        """:meth:`enqueue` for an ``AsyncSession`` or ``AsyncConnection``; same guarantees.

        The job is written in the async session's transaction and exists if and only if that
        commits; bad input raises before any SQL is sent.
        """
        options = _given(
            run_at=run_at,
            priority=priority,
            queue=queue,
            max_attempts=max_attempts,
            lease=lease,
            backoff=backoff,
            unique_mode=unique_mode,
            unique_period=unique_period,
        )
        keys = None if unique_key is None else [unique_key]
        edges = check_dependencies(depends_on)
        enqueue = self._enqueuer(task, [payload], keys, options, _insert_one, edges)
        return (await run_async(session, enqueue))[0]

    def enqueue_many(
        self,
        session: SessionLike,
        task: str | Task[P],
        payloads: Iterable[P],
        *,
        run_at: datetime | timedelta | None = None,
        priority: int | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        lease: timedelta | None = None,
        backoff: Backoff | None = None,
        unique_keys: Sequence[str | None] | None = None,
        unique_mode: UniqueMode | None = None,
        unique_period: timedelta | None = None,
        depends_on: Sequence[int | Dependency] | None = None,
    ) -> list[Enqueued]:
        """Add one job per payload, all of one task, in one go; return their ids in order.

        Same rules as :meth:`enqueue`; every payload is checked before anything is sent, so a
        bad one rejects the whole batch and inserts nothing. One NOTIFY for the batch. Fewer
        than 200 jobs, or jobs with unique keys, go in by one INSERT; more by COPY on the
        session's connection, in its transaction, after one statement that draws their ids.
        SQLAlchemy's cursor events see that statement, not the COPY.

        ``unique_keys``: one key per payload, as ``unique_key`` of :meth:`enqueue` (a None
        entry, or no list, leaves the key to the task's ``unique_key`` function). A payload
        whose key a live job holds gets that job's id (``.created`` False), and so does a later
        payload of the batch with the same key as an earlier one: it gets the earlier one's job.
        In replace and debounce modes the last payload of a key is the one kept, as if the
        payloads had been enqueued one after another.

        ``depends_on``: as for :meth:`enqueue`, for every job of the batch.
        """
        items = list(payloads)
        keys = None if unique_keys is None else list(unique_keys)
        options = _given(
            run_at=run_at,
            priority=priority,
            queue=queue,
            max_attempts=max_attempts,
            lease=lease,
            backoff=backoff,
            unique_mode=unique_mode,
            unique_period=unique_period,
        )
        edges = check_dependencies(depends_on)
        enqueue = self._enqueuer(task, items, keys, options, insert_many, edges)
        if not items and not self.middleware:
            return []
        return enqueue(connection_of(session))

    async def aenqueue_many(
        self,
        session: AsyncSessionLike,
        task: str | Task[P],
        payloads: Iterable[P],
        *,
        run_at: datetime | timedelta | None = None,
        priority: int | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        lease: timedelta | None = None,
        backoff: Backoff | None = None,
        unique_keys: Sequence[str | None] | None = None,
        unique_mode: UniqueMode | None = None,
        unique_period: timedelta | None = None,
        depends_on: Sequence[int | Dependency] | None = None,
    ) -> list[Enqueued]:
        """:meth:`enqueue_many` for an ``AsyncSession`` or ``AsyncConnection``; same guarantees."""
        items = list(payloads)
        keys = None if unique_keys is None else list(unique_keys)
        options = _given(
            run_at=run_at,
            priority=priority,
            queue=queue,
            max_attempts=max_attempts,
            lease=lease,
            backoff=backoff,
            unique_mode=unique_mode,
            unique_period=unique_period,
        )
        edges = check_dependencies(depends_on)
        enqueue = self._enqueuer(task, items, keys, options, insert_many, edges)
        if not items and not self.middleware:
            return []
        return await run_async(session, enqueue)

    # -- workflows: see sa_jobqueue.workflows ------------------------------------------------

    def chain(
        self,
        session: SessionLike,
        calls: Sequence[Call],
        *,
        depends_on: Sequence[int | Dependency] | None = None,
        on_failure: OnFailure = "cancel",
    ) -> list[Enqueued]:
        """Enqueue ``calls`` in the caller's transaction, each waiting for the one before (the
        first for ``depends_on``, if given); their ids, in order.

        A step reads what the step before it returned (its task declared with
        ``keep_result=True``) with ``ctx.upstream_results()``. A step that ends dead or
        cancelled cancels the rest of the chain, or, with ``on_failure="run"``, lets the next
        one run anyway. See :mod:`sa_jobqueue.workflows`.
        """
        ids: list[Enqueued] = []
        edges = check_dependencies(depends_on)
        for call in calls:
            (job_id,) = self._enqueue_calls(session, [call], edges, frozenset(ids[-1:]))
            ids.append(job_id)
            edges = [Dependency(job_id, on_failure)]
        return ids

    def group(self, session: SessionLike, calls: Sequence[Call]) -> list[Enqueued]:
        """Enqueue ``calls`` to run side by side, in the caller's transaction; their ids, in
        order. Calls of one task with the same options go in together (by COPY from 200 on),
        so a group of 10,000 is a few statements."""
        ids: list[Enqueued] = []
        for _, run in itertools.groupby(calls, key=_batch_key):
            ids += self._enqueue_calls(session, list(run), [], frozenset())
        return ids

    def chord(
        self,
        session: SessionLike,
        calls: Sequence[Call],
        callback: Call,
        *,
        on_failure: OnFailure = "cancel",
    ) -> tuple[list[Enqueued], Enqueued]:
        """A :meth:`group` and a ``callback`` that runs once every job of the group has ended
        (reading their results with ``ctx.upstream_results()``): the group's ids, and the
        callback's. A member that ends dead or cancelled cancels the callback, or, with
        ``on_failure="run"``, does not stop it."""
        members = self.group(session, calls)
        edges = [Dependency(job_id, on_failure) for job_id in members]
        (last,) = self._enqueue_calls(session, [callback], edges, frozenset(members))
        return members, last

    async def achain(
        self,
        session: AsyncSessionLike,
        calls: Sequence[Call],
        *,
        depends_on: Sequence[int | Dependency] | None = None,
        on_failure: OnFailure = "cancel",
    ) -> list[Enqueued]:
        """:meth:`chain` for an ``AsyncSession`` or ``AsyncConnection``."""
        return await run_async(
            session,
            lambda conn: self.chain(conn, calls, depends_on=depends_on, on_failure=on_failure),
        )

    async def agroup(self, session: AsyncSessionLike, calls: Sequence[Call]) -> list[Enqueued]:
        """:meth:`group` for an ``AsyncSession`` or ``AsyncConnection``."""
        return await run_async(session, lambda conn: self.group(conn, calls))

    async def achord(
        self,
        session: AsyncSessionLike,
        calls: Sequence[Call],
        callback: Call,
        *,
        on_failure: OnFailure = "cancel",
    ) -> tuple[list[Enqueued], Enqueued]:
        """:meth:`chord` for an ``AsyncSession`` or ``AsyncConnection``."""
        return await run_async(
            session, lambda conn: self.chord(conn, calls, callback, on_failure=on_failure)
        )

    def _enqueue_calls(
        self,
        session: SessionLike,
        calls: list[Call],
        edges: list[Dependency],
        new: frozenset[int],
    ) -> list[Enqueued]:
        """Enqueue ``calls`` (one task, the same options) waiting for ``edges``; ``new``: the
        dependencies enqueued in this transaction."""
        first = calls[0]
        options = check_call_options(first.options)
        payloads = [call.payload for call in calls]
        enqueue = self._enqueuer(first.task, payloads, None, options, insert_many, edges, new)
        return enqueue(connection_of(session))

    def _enqueuer(
        self,
        task: str | Task,
        payloads: list[Any],
        unique_keys: Sequence[str | None] | None,
        options: Mapping[str, Any],
        insert: Callable[[Connection, NewJobs], list[Enqueued]],
        edges: list[Dependency],
        new: frozenset[int] = frozenset(),
    ) -> Callable[[Connection], list[Enqueued]]:
        """The enqueue, to run on the caller's connection: ``insert`` of the jobs, after the
        middleware and with ``edges`` (``new``: dependencies enqueued in this transaction).

        Everything is checked and encoded here, before any SQL, in the caller's thread or task;
        with middleware, which may change them, the jobs are checked once it has run, and only
        the trace context is taken now (an async enqueue's middleware runs in SQLAlchemy's
        greenlet, where the caller's context variables are not current).
        """
        if self.middleware:
            trace = self._traced()

            def through(conn: Connection) -> list[Enqueued]:
                return self._through(
                    conn, task, payloads, unique_keys, options, insert, trace, edges, new
                )

            return through
        jobs = self._new_jobs(task, payloads, unique_keys, options)
        return lambda conn: enqueue_with(conn, edges, functools.partial(insert, conn, jobs), new)

    def _new_jobs(
        self,
        task: str | Task,
        payloads: list[Any],
        unique_keys: Sequence[str | None] | None,
        options: Mapping[str, Any],
        trace: Callable[[], str | None] | None = None,
    ) -> NewJobs:
        """Check and encode everything enqueue was given; no I/O.

        ``unique_keys`` is parallel to ``payloads``; for a None entry (or no list) the task's
        function, if it has one, gives the key. ``options`` are the enqueue options given
        (none: the task's defaults, resolved once). ``trace`` gives the trace context, when
        it was taken before (see :meth:`_traced`).
        """
        found = self._registry.lookup(task)
        if not options:
            resolved = self._defaults.get(found.name)
            if resolved is None or resolved.task is not found:
                resolved = self._defaults[found.name] = resolve_options(found)
        else:
            resolved = resolve_options(found, **options)
        # The trace context is taken before any I/O and in the caller's thread or task: the
        # span that is current where enqueue was called is the one the job's run points to.
        return new_jobs(
            resolved,
            payloads,
            unique_keys,
            max_payload_bytes=self.max_payload_bytes,
            trace_context=trace or self._trace_context,
        )

    def _traced(self) -> Callable[[], str | None] | None:
        """The trace context of the caller, taken now (see :meth:`_enqueuer`)."""
        if self._trace_context is None:
            return None
        context = self._trace_context()
        return lambda: context

    def _through(
        self,
        conn: Connection,
        task: str | Task,
        payloads: list[Any],
        unique_keys: Sequence[str | None] | None,
        options: Mapping[str, Any],
        insert: Callable[[Connection, NewJobs], list[Enqueued]],
        trace: Callable[[], str | None] | None,
        edges: list[Dependency],
        new: frozenset[int],
    ) -> list[Enqueued]:
        """Enqueue through the middleware: each may change the call, or refuse it.

        The middleware runs before any of the queue's SQL: the dependencies are locked (and an
        unknown one refused) at the end of the chain, on the connection the call then names,
        just before the insert."""

        def proceed(call: Enqueueing) -> list[Enqueued]:
            keys = None if call.unique_keys is None else list(call.unique_keys)
            jobs = self._new_jobs(call.task, list(call.payloads), keys, call.options, trace)
            if not call.payloads:
                return []
            conn = call.connection
            return enqueue_with(conn, edges, functools.partial(insert, conn, jobs), new)

        found = self._registry.lookup(task)
        call = Enqueueing(found, tuple(payloads), unique_keys, dict(options), conn)
        return enqueue_chain(self.middleware, proceed)(call)

    # -- job admin: see sa_jobqueue.ops.admin ----------------------------------------------------

    def cancel(self, session: SessionLike, job_id: int) -> bool:
        """Cancel a job in the caller's transaction; True if it was queued or running.

        A queued job becomes ``cancelled`` and never runs. For a running job, cancellation is
        requested: its handler sees ``ctx.cancel_requested`` (and ``ctx.stop_requested``)
        within one lease-renewal interval, and when the attempt ends, whether it returns or
        raises, its ``ctx.session`` writes roll back and the job ends ``cancelled``, never
        retried. Python cannot interrupt a running thread, so a sync handler that does not
        look at the flag runs to its end first. A finished job is left as it is (False).
        """
        return admin.cancel_job(session, job_id)

    async def acancel(self, session: AsyncSessionLike, job_id: int) -> bool:
        """:meth:`cancel` for an ``AsyncSession`` or ``AsyncConnection``."""
        return await run_async(session, lambda conn: admin.cancel_job(conn, job_id))

    def requeue(
        self,
        session: SessionLike,
        job_id: int,
        *,
        attempts: Literal["extend", "reset"] = "extend",
    ) -> bool:
        """Put a ``dead`` job back in its queue, due now, in the caller's transaction.

        True if the job was dead and is queued again; False (nothing changed) if it is not
        dead, does not exist, or its unique key is now held by another waiting, queued or
        running job of its task. ``finished_at`` is cleared; ``last_error`` is kept until the
        next attempt records its own outcome. Never commits; one NOTIFY wakes the queue's
        workers at commit.

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
        return admin.requeue_job(session, job_id, attempts=attempts)

    # -- inspection -------------------------------------------------------------------------

    def get_job(self, session: SessionLike, job_id: int) -> JobInfo | None:
        """Read one job as it is in the caller's transaction, or None if there is no such id."""
        return admin.get_job(session, job_id)

    async def aget_job(self, session: AsyncSessionLike, job_id: int) -> JobInfo | None:
        """:meth:`get_job` for an ``AsyncSession`` or ``AsyncConnection``."""
        return await run_async(session, lambda conn: admin.get_job(conn, job_id))

    def list_jobs(
        self,
        session: SessionLike,
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
        return admin.list_jobs(
            session,
            queue=queue,
            status=status,
            task=task,
            older_than=older_than,
            limit=limit,
            after_id=after_id,
            newest_first=newest_first,
        )

    # -- results ----------------------------------------------------------------------------

    def get_result(self, session: SessionLike, job_id: int) -> JobResult | None:
        """Job ``job_id``'s outcome as the caller's transaction sees it (None: no such job):
        its status, and, once it succeeded, what its handler returned if its task keeps
        results (``keep_result=True``). ``.get()`` gives the value or raises JobFailedError."""
        return results.get_result(session, job_id)

    async def aget_result(self, session: AsyncSessionLike, job_id: int) -> JobResult | None:
        """:meth:`get_result` for an ``AsyncSession`` or ``AsyncConnection``."""
        return await run_async(session, lambda conn: results.get_result(conn, job_id))

    @overload
    def wait_for_result(self, engine: Engine, job_id: int, *, timeout: float) -> JobResult: ...

    @overload
    def wait_for_result(
        self, engine: Engine, job_id: Sequence[int], *, timeout: float
    ) -> list[JobResult]: ...

    def wait_for_result(
        self, engine: Engine, job_id: int | Sequence[int], *, timeout: float
    ) -> JobResult | list[JobResult]:
        """Block until job ``job_id`` has ended (succeeded, dead or cancelled), or every job of
        a list of ids; the outcome, or the outcomes in the list's order.

        Woken by the NOTIFY of a stored result as it commits, and reading the jobs again
        every half second whatever it hears. Raises ResultTimeoutError after ``timeout``
        seconds, and UnknownJobError at once for an id with no job (not committed yet, or
        pruned). Takes one connection of ``engine`` while it waits. See
        :mod:`sa_jobqueue.results`.
        """
        if isinstance(job_id, int):
            return results.wait_for_results(engine, [job_id], timeout)[0]
        return results.wait_for_results(engine, job_id, timeout)

    @overload
    async def await_result(
        self, engine: AsyncEngine, job_id: int, *, timeout: float
    ) -> JobResult: ...

    @overload
    async def await_result(
        self, engine: AsyncEngine, job_id: Sequence[int], *, timeout: float
    ) -> list[JobResult]: ...

    async def await_result(
        self, engine: AsyncEngine, job_id: int | Sequence[int], *, timeout: float
    ) -> JobResult | list[JobResult]:
        """:meth:`wait_for_result` on an asyncio event loop, with an ``AsyncEngine``."""
        if isinstance(job_id, int):
            return (await results.await_results(engine, [job_id], timeout))[0]
        return await results.await_results(engine, job_id, timeout)

    def counts(self, session: SessionLike) -> dict[str, dict[str, int]]:
        """Job counts as ``{queue: {status: n}}``."""
        return admin.count_jobs(session)


def _given(**options: Any) -> dict[str, Any]:
    """The enqueue options a call gave (left out: None), by name."""
    return {name: value for name, value in options.items() if value is not None}


def _insert_one(conn: Connection, new: NewJobs) -> list[Enqueued]:
    return [insert_one(conn, new)]


def _batch_key(call: Call) -> tuple[str, str]:
    """Calls that can go in together: the same task and the same options."""
    task = call.task if isinstance(call.task, str) else call.task.name
    return task, repr(sorted(call.options.items()))
