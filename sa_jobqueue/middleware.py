"""Middleware: your code around every enqueue and around every attempt of a job.

Give a :class:`~sa_jobqueue.JobQueue` a list of :class:`Middleware` objects
(``JobQueue(middleware=[...])``). Each hook gets the call and ``proceed``, the rest of the
chain: call it to go on (with the call as it is, or changed), return what it returns (or
something else), or raise to stop. The first middleware of the list is the outermost.

* :meth:`Middleware.enqueue` runs around ``enqueue``/``enqueue_many`` (and their async forms),
  in the caller's transaction, before any of the queue's SQL: it may change the payloads or
  the options (``dataclasses.replace(call, payloads=...)``), write rows of its own through
  ``call.connection`` (they commit or roll back with the jobs), or refuse by raising (nothing
  is inserted, and the caller's transaction is as usable as after any exception it raises).
* :meth:`Middleware.run` runs around a sync handler, and :meth:`Middleware.arun` around an
  ``async def`` one, inside the attempt: what it writes through ``ctx.session`` commits with
  the job's fenced completion, exactly once, or rolls back with a failed attempt; what it
  raises fails the attempt as the handler's own exception would; what it returns is the
  attempt's return value (the result a task with ``keep_result`` stores).

Observers (:mod:`sa_jobqueue.observability`) stay the place for read-only telemetry: they
see each attempt's outcome once it is recorded, and cannot change it.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection

if TYPE_CHECKING:
    from ._enqueue import Enqueued
    from .tasks import JobContext, Task

__all__ = ["Enqueueing", "Middleware"]

#: Sends an enqueue call on: to the next middleware, or at last to the insert.
ProceedEnqueue = Callable[["Enqueueing"], "list[Enqueued]"]
#: Runs an attempt on: the next middleware, or at last the handler.
ProceedRun = Callable[["JobContext", Any], Any]
#: :data:`ProceedRun` for an ``async def`` handler.
ProceedArun = Callable[["JobContext", Any], Awaitable[Any]]


@dataclass(frozen=True)
class Enqueueing:
    """One enqueue call, as middleware sees it: before any of the queue's SQL.

    ``payloads`` has one entry for ``enqueue``, one per job for ``enqueue_many``;
    ``unique_keys`` runs parallel to it (None: the task decides). ``options`` holds the
    enqueue options the caller gave, those of :class:`~sa_jobqueue.queue.JobOptions` that
    are not None; the task's declaration fills in the rest. ``connection`` is the caller's, in
    the caller's transaction (or the one ``enqueue`` began for an Engine).
    """

    task: Task
    payloads: Sequence[Any]
    unique_keys: Sequence[str | None] | None
    options: Mapping[str, Any]
    connection: Connection


class Middleware:
    """A hook around enqueue and around each attempt; each passes the call on unchanged until
    overridden. Subclass it and override what you need::

        class Tenant(Middleware):
            def enqueue(self, call, proceed):
                tagged = [{**p, "tenant": current_tenant()} for p in call.payloads]
                return proceed(dataclasses.replace(call, payloads=tagged))

            def run(self, ctx, payload, proceed):
                with tenant_scope(payload["tenant"]):
                    return proceed(ctx, payload)
    """

    def enqueue(self, call: Enqueueing, proceed: ProceedEnqueue) -> list[Enqueued]:
        """Around an enqueue: ``proceed(call)`` enqueues (the ids, one per payload)."""
        return proceed(call)

    def run(self, ctx: JobContext, payload: Any, proceed: ProceedRun) -> Any:
        """Around one attempt of a sync handler: ``proceed(ctx, payload)`` runs it."""
        return proceed(ctx, payload)

    async def arun(self, ctx: JobContext, payload: Any, proceed: ProceedArun) -> Any:
        """Around one attempt of an ``async def`` handler: ``await proceed(ctx, payload)``."""
        return await proceed(ctx, payload)


def enqueue_chain(middleware: Sequence[Middleware], last: ProceedEnqueue) -> ProceedEnqueue:
    """``last`` (the insert) wrapped in ``middleware``, the first outermost."""
    chain = last
    for layer in reversed(middleware):
        chain = functools.partial(_enqueue_layer, layer, chain)
    return chain


def _enqueue_layer(layer: Middleware, proceed: ProceedEnqueue, call: Enqueueing) -> list[Enqueued]:
    return layer.enqueue(call, proceed)


def run_chain(middleware: Sequence[Middleware], handler: ProceedRun) -> ProceedRun:
    """A sync ``handler`` wrapped in ``middleware``'s :meth:`Middleware.run`."""
    chain = handler
    for layer in reversed(middleware):
        chain = functools.partial(_run_layer, layer, chain)
    return chain


def _run_layer(layer: Middleware, proceed: ProceedRun, ctx: JobContext, payload: Any) -> Any:
    return layer.run(ctx, payload, proceed)


def arun_chain(middleware: Sequence[Middleware], handler: ProceedArun) -> ProceedArun:
    """An ``async def`` ``handler`` wrapped in ``middleware``'s :meth:`Middleware.arun`."""
    chain = handler
    for layer in reversed(middleware):
        chain = functools.partial(_arun_layer, layer, chain)
    return chain


async def _arun_layer(
    layer: Middleware, proceed: ProceedArun, ctx: JobContext, payload: Any
) -> Any:
    return await layer.arun(ctx, payload, proceed)
