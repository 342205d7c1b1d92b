"""Calling one task's handler in-process, its ``ctx.session`` a savepoint in your transaction.

Internal to :mod:`sa_jobqueue.testing`, which exports :func:`run_task`; may change without
notice.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
from collections.abc import Callable
from typing import Any, cast

from sqlalchemy.orm import Session, scoped_session

from .._binds import SessionLike
from .._payloads import DEFAULT_MAX_PAYLOAD_BYTES, encode_payload
from ..batching import BatchContext, BatchJob
from ..errors import InvalidJobError, JobQueueError
from ..tasks import JobContext, Task
from ..worker._sessions import HandlerSession
from ._reading import connection_of


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
    gets it decoded afresh, as from a worker: a typed payload (a dataclass, TypedDict or
    Pydantic model) is checked against its type (PayloadTypeError) and rebuilt from its JSON.
    An ``async def`` handler runs on a new event loop (``asyncio.run``), so call this from a
    synchronous test. The handler's exceptions propagate.

    ``ctx.session`` writes into the transaction of ``session`` (yours), within a savepoint, as
    in production: ``ctx.session.commit()`` only flushes, and if the handler raises its writes
    roll back while your transaction goes on. Nothing is ever committed: check the writes
    through your session, and roll it back or commit it as your test does. When the handler
    uses ``ctx.session``, your Session is flushed first (so the handler sees your objects) and
    expired afterwards (so they show its writes). Without ``session``, a handler that asks for
    ``ctx.session`` fails with a message saying to pass one.

    ``ctx.job_id``, ``ctx.attempt`` and ``ctx.max_attempts`` (default: the task's) are what you
    pass; ``ctx.queue`` and ``ctx.priority`` are the task's; ``ctx.created_at`` is now (this
    machine's clock); ``stop_requested`` and ``cancel_requested`` stay False. The task's
    timeout is not enforced. No job row is read or written.

    A batch task (``JobQueue.batch_task``) takes a list of payloads: its handler gets one
    batch of them, as :class:`~sa_jobqueue.BatchJob` objects with ids from ``job_id`` up, and a
    :class:`~sa_jobqueue.BatchContext` whose ``session`` is that savepoint. The verdicts the
    handler gives single jobs (``ctx.fail`` ...) are not recorded anywhere: to see them
    applied, run the jobs with :func:`drain`.
    """
    __tracebackhide__ = True
    limit = task.max_attempts if max_attempts is None else max_attempts
    if not 1 <= attempt <= limit:
        raise InvalidJobError(f"attempt must be from 1 to max_attempts ({limit}), not {attempt}")
    make_session = functools.partial(_handler_session, session, task.name)
    ctx: Any  # a JobContext, or a batch task's BatchContext
    if task.batching is not None:
        if not isinstance(payload, list | tuple):
            raise InvalidJobError(f"batch task {task.name!r} takes a list of payloads")
        made = [
            _context(task, job_id + i, attempt, limit, make_session) for i in range(len(payload))
        ]
        decoded: Any = [
            BatchJob(c.job_id, _as_run(task, p), attempt, limit, c.created_at, task.priority)
            for c, p in zip(made, payload, strict=True)
        ]
        ctx = BatchContext(
            task=task.name,
            queue=task.queue,
            job_ids=[c.job_id for c in made],
            members=made,
            session=make_session,
        )
    else:
        decoded = _as_run(task, payload)
        ctx = _context(task, job_id, attempt, limit, make_session)
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


def _context(
    task: Task, job_id: int, attempt: int, limit: int, session: Callable[[], Session]
) -> JobContext:
    return JobContext(
        job_id=job_id,
        task=task.name,
        queue=task.queue,
        attempt=attempt,
        max_attempts=limit,
        priority=task.priority,
        session=session,
    )


def _as_run(task: Task, payload: Any) -> Any:
    """The payload as a worker's handler would get it: through enqueue's JSON, and rebuilt."""
    codec = task.payload_codec
    if codec is not None:
        _, payload = codec.prepare(payload)  # PayloadTypeError, as enqueue would raise
    decoded = json.loads(encode_payload(payload, max_bytes=DEFAULT_MAX_PAYLOAD_BYTES))
    if codec is not None:
        decoded = codec.rebuild(decoded)  # what a worker would rebuild from the stored JSON
    return decoded


def _handler_session(session: SessionLike | None, task: str) -> Session:
    """The handler's Session: a savepoint in the caller's transaction, as the worker's would be
    a transaction of its own (``commit()`` only flushes)."""
    if session is None:
        raise JobQueueError(
            f"the handler of {task!r} uses ctx.session: pass run_task(..., session=...)"
        )
    if isinstance(session, Session | scoped_session):
        session.flush()  # the handler's session is another one: let it see the caller's objects
    conn = connection_of(session)
    if not conn.in_transaction():
        conn.begin()  # the caller's, left open: the savepoint needs a transaction to live in
    return HandlerSession(bind=conn, join_transaction_mode="create_savepoint")
