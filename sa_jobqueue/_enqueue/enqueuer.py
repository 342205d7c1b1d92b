"""The Enqueuer: one JobQueue's enqueue pipeline, from the call to the work on a Connection.

Each call is prepared without I/O, in the caller's thread or task: option names checked,
dependencies checked, the task looked up, options resolved (each task's defaults once), payloads
encoded and keys settled, and the trace context taken. What is left is a *work*, a function of
the Connection to write through, which the sync and async shells of ``JobQueue`` (see
:mod:`.transactions`) run on the caller's connection or in a transaction of their own. With
middleware, which may change the call, the jobs are checked once it has run, inside the work;
only the trace context is taken before.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection

from .._registry import TaskRegistry
from ..errors import InvalidJobError
from ..middleware import Enqueueing, Middleware, enqueue_chain
from ..tasks import Task
from ..workflows import Call, Dependency, check_call_options, check_dependencies, enqueue_with
from .inserting import insert_many, insert_one
from .jobs import Enqueued, NewJobs, new_jobs
from .options import (
    Callback,
    EnqueueManyOptions,
    EnqueueOptions,
    ResolvedOptions,
    check_names,
    resolve_options,
)

#: Writes checked jobs on a Connection: :func:`.inserting.insert_one` or ``insert_many``.
Insert = Callable[[Connection, NewJobs], list[Enqueued]]
#: An enqueue prepared and checked, to run on the Connection of the transaction it joins.
Work = Callable[[Connection], list[Enqueued]]


class Enqueuer:
    """Prepares enqueues for the tasks of ``registry``: checks, encodes, and leaves a work.

    ``middleware`` runs around each enqueue (the first outermost); ``max_payload_bytes``
    bounds each encoded payload; ``trace_context``, if given, returns the caller's trace
    context as JSON text (or None outside a trace) and is stored with each job.
    """

    def __init__(
        self,
        registry: TaskRegistry,
        *,
        middleware: Sequence[Middleware],
        max_payload_bytes: int,
        trace_context: Callable[[], str | None] | None,
    ) -> None:
        self.registry = registry
        self.middleware = tuple(middleware)
        self.max_payload_bytes = max_payload_bytes
        self.trace_context = trace_context
        #: Each task's options when enqueue overrides none, resolved once (a Task is frozen).
        self._defaults: dict[str, ResolvedOptions] = {}

    def one(self, task: str | Task, payload: Any, options: EnqueueOptions) -> Work:
        """``enqueue``'s work: one job (a list of its one id). ``options`` is consumed."""
        key = None
        edges: list[Dependency] = []
        if options:
            key = options.pop("unique_key", None)
            edges = _dependencies(options)
        keys = None if key is None else [key]
        return self.work(task, [payload], keys, options, insert_one, edges)

    def many(
        self, task: str | Task, payloads: Iterable[Any], options: EnqueueManyOptions
    ) -> Work | None:
        """``enqueue_many``'s work, or None when there is nothing to send (no payloads, no
        middleware): the call then touches no connection. ``options`` is consumed."""
        items = list(payloads)
        keys: list[str | None] | None = None
        edges: list[Dependency] = []
        if options:
            unique_keys = options.pop("unique_keys", None)
            if unique_keys is not None:
                keys = list(unique_keys)
            edges = _dependencies(options)
        work = self.work(task, items, keys, options, insert_many, edges)
        return work if items or self.middleware else None

    def work(
        self,
        task: str | Task,
        payloads: list[Any],
        unique_keys: Sequence[str | None] | None,
        options: Mapping[str, Any],
        insert: Insert,
        edges: list[Dependency],
        new: frozenset[int] = frozenset(),
    ) -> Work:
        """The enqueue of ``payloads``, checked: ``insert`` of the jobs, after the middleware
        and with ``edges`` (``new``: dependencies enqueued in the same transaction).

        ``options`` are the option values given (None: the task's). Bad input raises here,
        before any SQL, unless middleware runs: then the jobs are checked once it has, and only
        the task and the trace context are taken now (an async enqueue's middleware runs in
        SQLAlchemy's greenlet, where the caller's context variables are not current).
        """
        if self.middleware:
            found = self.registry.lookup(task)
            items = tuple(payloads)
            given = {name: value for name, value in options.items() if value is not None}

            def call(conn: Connection) -> Enqueueing:
                # The call as middleware sees it, on the connection the work is given: made
                # anew for each run of the work (an Engine's transaction is tried again), so
                # what one try's middleware changed in place, the next try does not see.
                keys = None if unique_keys is None else list(unique_keys)
                return Enqueueing(found, items, keys, dict(given), conn)

            return functools.partial(self._through, call, insert, self._traced(), edges, new)
        jobs = self.new_jobs(self.registry.lookup(task), payloads, unique_keys, options)
        if not edges:
            return lambda conn: insert(conn, jobs)
        return lambda conn: enqueue_with(conn, edges, functools.partial(insert, conn, jobs), new)

    def new_jobs(
        self,
        task: Task,
        payloads: list[Any],
        unique_keys: Sequence[str | None] | None,
        options: Mapping[str, Any],
        trace: Callable[[], str | None] | None = None,
        workflow_callback: Callback | None = None,
    ) -> NewJobs:
        """Check and encode everything an enqueue of ``task`` was given; no I/O.

        ``unique_keys`` is parallel to ``payloads``; for a None entry (or no list) the task's
        function, if it has one, gives the key. ``options`` are the enqueue options given
        (none: the task's defaults, resolved once). ``trace`` gives the trace context, when it
        was taken before (see :meth:`_traced`). ``workflow_callback``: the error callback of the
        workflow the jobs join, carried by each of them.
        """
        given = options.get("on_error")
        if given is not None:
            options = {**options, "on_error": self.callback(given)}
        if not options:
            resolved = self._defaults.get(task.name)
            if resolved is None or resolved.task is not task:
                resolved = self._defaults[task.name] = resolve_options(task)
        else:
            resolved = resolve_options(task, **options)
        if workflow_callback is not None:
            resolved = resolved.with_workflow_callback(workflow_callback)
        # The trace context is taken before any I/O and in the caller's thread or task: the
        # span that is current where enqueue was called is the one the job's run points to.
        return new_jobs(
            resolved,
            payloads,
            unique_keys,
            max_payload_bytes=self.max_payload_bytes,
            trace_context=trace or self.trace_context,
        )

    def callback(self, value: Any) -> Callback:
        """An error callback as given (a Task, a task name, a Call), resolved: InvalidJobError
        for anything else, or a Call's payload that is not a JSON object."""
        if isinstance(value, Callback | Task):
            return Callback(value) if isinstance(value, Task) else value
        if isinstance(value, Call):
            if value.payload is not None and not isinstance(value.payload, Mapping):
                raise InvalidJobError(
                    f"an error callback's payload is a JSON object or None, not {value.payload!r}"
                )
            options = check_call_options(value.options)
            return Callback(self.registry.lookup(value.task), value.payload, options)
        if isinstance(value, str):
            return Callback(self.registry.lookup(value))
        raise InvalidJobError(f"on_error is a task, a task name or a Call, not {value!r}")

    def _traced(self) -> Callable[[], str | None] | None:
        """The trace context of the caller, taken now (see :meth:`work`)."""
        if self.trace_context is None:
            return None
        context = self.trace_context()
        return lambda: context

    def _through(
        self,
        call: Callable[[Connection], Enqueueing],
        insert: Insert,
        trace: Callable[[], str | None] | None,
        edges: list[Dependency],
        new: frozenset[int],
        conn: Connection,
    ) -> list[Enqueued]:
        """Enqueue through the middleware: each may change the call, or refuse it.

        The middleware runs before any of the queue's SQL: the dependencies are locked (and an
        unknown one refused) at the end of the chain, on the connection the call then names,
        just before the insert."""

        def proceed(call: Enqueueing) -> list[Enqueued]:
            keys = None if call.unique_keys is None else list(call.unique_keys)
            jobs = self.new_jobs(call.task, list(call.payloads), keys, call.options, trace)
            if not call.payloads:
                return []
            conn = call.connection
            return enqueue_with(conn, edges, functools.partial(insert, conn, jobs), new)

        return enqueue_chain(self.middleware, proceed)(call(conn))


def _dependencies(options: EnqueueOptions | EnqueueManyOptions) -> list[Dependency]:
    """Take ``depends_on`` out of ``options``, whose other names are then checked (the per-call
    key or keys taken out before): its edges, checked."""
    depends_on = options.pop("depends_on", None)
    check_names(options)
    return check_dependencies(depends_on)
