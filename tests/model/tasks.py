"""The tasks the model checker's worker subprocesses run: one handler, driven by its payload.

A payload is ``{"n": N, "plan": [action, ...], "k": KEY}``: attempt ``a`` does
``plan[min(a, len(plan)) - 1]``. Every attempt first records its start in ``mc_starts``
through an autocommit connection of its own (the database's ``clock_timestamp()``, its
claim's time, the job's ``started_at``, and whether its session is a savepoint of its
thread's group), then
writes its effect row into ``mc_effects`` through ``ctx.session``, then does its action:

- ``ok``: return (a kept result is ``{"n": N}``); ``slow``: sleep a little first;
- ``long``: sleep past the task's lease (heartbeats must keep the job);
- ``fail``: raise (retried after the backoff, or dead); ``retry``: ``Retry(after=...)``;
- ``discard``: ``Discard`` (dead at once); ``hold``: wait up to 3 s for ``cancel_requested``.

``mc_effects`` has no unique constraint: a second committed effect of one job is visible as a
second row, never hidden by a conflict. Only the effect of the attempt that succeeded may
exist. Before returning or raising, the handler records its end in ``mc_ends``: a start
without an end is an attempt whose process died or stalled. An attempt whose ``ctx.session``
raised (making it, or writing the effect) records the error with its end, and whether it was
SQLAlchemy refusing to use the session at all (:func:`unusable`), then raises it. Leases and
backoffs are short so that a seed settles in seconds.

The ``quick`` task's handler makes no round trip but its effect's: it hands its start and
end to a thread of the worker process that writes them soon after (:func:`_later`), so that
it runs in a few milliseconds, well under the worker's ``GROUP_FAST``, and its jobs share
their thread's group commit. Its audit rows are late (their ``clock_timestamp()`` is when
they were written) and may be missing (a worker killed before it wrote them): the checks
that read them are sound either way (see ``invariants.py``), and ``worker_bound`` leaves its
jobs out. Its plans are the fast ones (``schedule.QUICK_ACTIONS``).

The ``typed`` task's handler takes a :class:`TypedPlan` (a TypedDict): its payloads are
checked at enqueue and rebuilt by the worker before the handler runs; one that no longer
fits fails its attempt before the handler starts.

The ``limited`` task has a hard time limit (``hard_timeout``, :data:`HARD_LIMIT`): each
attempt runs :func:`limited` in a child process of its worker, which kills it at the limit.
Its ``long`` and ``hold`` actions outlast the limit: such an attempt writes its effect, then
is killed, its effect rolled back, its failure a ``HardTimeoutError``. Its audit rows name
the worker's pid (:func:`worker_pid`), as a thread's would.

The ``batched`` task is a batch task (``queue.batch_task``, batches of up to
:data:`BATCH_SIZE` jobs of one payload key ``k``): :func:`batched` does each job's action
for its attempt, giving ``fail``, ``retry`` and ``discard`` to the job alone
(``ctx.fail``, ``ctx.retry``, ``ctx.discard``), and its own ``crash`` fails the whole batch.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue as queues
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Final

import sqlalchemy as sa
from typing_extensions import TypedDict

from sa_jobqueue import Backoff, BatchContext, BatchJob, Discard, JobContext, JobQueue, Retry
from sa_jobqueue.models import jobs_table
from sa_jobqueue.worker._sessions import GroupSession

metadata = sa.MetaData()

effects = sa.Table(
    "mc_effects",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("job_id", sa.BigInteger, nullable=False, index=True),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
)
starts = sa.Table(
    "mc_starts",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("job_id", sa.BigInteger, nullable=False, index=True),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("queue", sa.Text, nullable=False),
    sa.Column("task", sa.Text, nullable=False),
    sa.Column("key", sa.Text),
    sa.Column("at", sa.DateTime(timezone=True), server_default=sa.func.clock_timestamp()),
    #: The attempt's claim time (its job's ``started_at``, the claim's ``now()``), read as
    #: the handler starts; NULL if the job has moved on to another attempt by then.
    sa.Column("claimed_at", sa.DateTime(timezone=True)),
    #: Whether the attempt ran in its thread's group (its session a savepoint of the group's
    #: transaction): a group rolled back hands its jobs back with their attempt uncounted.
    sa.Column("grouped", sa.Boolean),
    #: For a batch task's attempt: its batch (the worker's pid and the batch's first job and
    #: attempt), the same for every job of the batch.
    sa.Column("batch", sa.Text),
)
ends = sa.Table(
    "mc_ends",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("job_id", sa.BigInteger, nullable=False, index=True),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("action", sa.Text, nullable=False),
    sa.Column("pid", sa.Integer),
    sa.Column("at", sa.DateTime(timezone=True), server_default=sa.func.clock_timestamp()),
    #: What ``ctx.session`` raised, if it did (the class and the message), and whether it was
    #: an :func:`unusable` one.
    sa.Column("error", sa.Text),
    sa.Column("unusable", sa.Boolean),
)


def unusable(error: BaseException) -> bool:
    """Whether ``ctx.session`` raised because SQLAlchemy will not use the connection it was
    given at all: a transaction left invalid by a lost connection ("Can't reconnect until
    invalid transaction is rolled back"), one already begun on it, a ``Connection`` closed
    (``InvalidRequestError`` and its subclasses).

    Not counted: a lost connection itself, which is the driver's error (a ``DBAPIError``, or
    psycopg's own for a group's savepoint); nor SQLAlchemy's pool giving up at checkout after
    its connections failed the ping again and again ("This connection is closed", an
    ``InvalidRequestError`` too, but raised in ``sqlalchemy.pool``): no connection could be
    had, which a storm of terminated backends may well cause.
    """
    if not isinstance(error, sa.exc.InvalidRequestError):
        return False
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    raised_in = "" if tb is None else str(tb.tb_frame.f_globals.get("__name__", ""))
    return not raised_in.startswith("sqlalchemy.pool")


#: The environment variable giving the audit's direct database URL (never through a proxy or
#: pooler the checker injects faults into, so the audit survives the faults it observes).
AUDIT_URL = "MC_AUDIT_URL"
LEASE = timedelta(seconds=2)
SHORT_LEASE = timedelta(seconds=1)
#: 0.1 s, 0.2 s, 0.4 s ... capped at 0.5 s: three failures cost under a second of waiting.
BACKOFF = Backoff(base=timedelta(seconds=0.1), cap=timedelta(seconds=0.5), jitter=0.1)
RETRY_AFTER = timedelta(seconds=0.2)
SLOW = 0.3
HOLD = 3.0
#: Every task the checker enqueues, with its declared lease (the checker's bounds use it).
LEASES: dict[str, timedelta] = {}
KEEPS: set[str] = set()
#: The tasks whose audit rows are written late, by a thread of their own (see the docstring).
LATE: set[str] = set()
#: The hard-limited tasks (``hard_timeout``): each attempt runs in a child process, killed at
#: HARD_LIMIT; a ``long`` or ``hold`` action outlasts it, so such an attempt never ends.
LIMITED: set[str] = set()
HARD_LIMIT = timedelta(seconds=1)
#: The batch tasks, with their ``max_size``.
BATCHES: dict[str, int] = {}
BATCH_SIZE = 5

queue = JobQueue()

_lock = threading.Lock()
_engine: sa.Engine | None = None


def _audit() -> sa.Engine:
    global _engine
    with _lock:
        if _engine is None:
            _engine = sa.create_engine(
                os.environ[AUDIT_URL],
                isolation_level="AUTOCOMMIT",
                pool_size=4,
                max_overflow=8,
                pool_pre_ping=True,
                connect_args={"application_name": "mc_audit", "connect_timeout": 5},
            )
        return _engine


def _record(table: sa.Table, **values: Any) -> None:
    # Twice: a pooled connection may have gone stale; the audit must not be why an attempt fails.
    for tries in (1, 2):
        try:
            with _audit().begin() as conn:
                conn.execute(table.insert().values(**values))
            return
        except sa.exc.DBAPIError:
            if tries == 2:
                raise


class _Writer:
    """Writes the audit rows handed to it, on a thread of its own, in the order given.

    A row that cannot be written (twice) is dropped: the checks only see fewer starts and ends.
    At the process's exit the rows still queued are written (for up to EXIT_FLUSH seconds).
    """

    EXIT_FLUSH = 2.0

    def __init__(self) -> None:
        self.rows: queues.SimpleQueue[tuple[sa.Table, dict[str, Any]] | None] = queues.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="mc-audit", daemon=True)
        self.thread.start()
        atexit.register(self.close)

    def _run(self) -> None:
        while (row := self.rows.get()) is not None:
            with contextlib.suppress(Exception):  # dropped, as the class says
                _record(row[0], **row[1])

    def close(self) -> None:
        self.rows.put(None)
        self.thread.join(self.EXIT_FLUSH)


_writer: _Writer | None = None


def _later(table: sa.Table, **values: Any) -> None:
    """Hand a row to the process's audit writer: no round trip on the handler's thread."""
    global _writer
    with _lock:
        if _writer is None:
            _writer = _Writer()
    _writer.rows.put((table, values))


def work(ctx: JobContext, payload: dict[str, Any]) -> object:
    """Do the action the payload's plan gives this attempt (see the module's docstring)."""
    return _attempt(ctx, payload, _record)


def quick(ctx: JobContext, payload: dict[str, Any]) -> object:
    """:func:`work` with its audit rows written late: a round trip only for its effect."""
    return _attempt(ctx, payload, _later)


class TypedPlan(TypedDict):
    """The ``typed`` task's payload: the plan's payload, checked at enqueue and rebuilt by
    the worker (``sa_jobqueue._payload_types``)."""

    n: int
    plan: list[str]
    k: str


def typed(ctx: JobContext, payload: TypedPlan) -> object:
    """:func:`work` for a typed payload: the worker rebuilt it before calling this."""
    return _attempt(ctx, dict(payload), _record)


def limited(ctx: JobContext, payload: dict[str, Any]) -> object:
    """:func:`work` in the child process a hard-limited attempt runs in; its audit rows name
    the worker's pid, as a thread's would."""
    return _attempt(ctx, payload, _record, pid=worker_pid())


#: The parent of the process that imported this module. The worker's forkserver imports it
#: (preloaded) as it starts, while the worker, its parent, is alive: in a hard-limited
#: attempt's child, forked from it, this is the worker's pid.
_IMPORTED_UNDER = os.getppid()


def worker_pid() -> int:
    """The pid of the worker that runs this attempt's child process.

    Not read from the process tree when the attempt starts: a worker SIGKILLed just after it
    asked for the child leaves the forkserver orphaned, adopted by pid 1 (model checker seed
    920039, whose audit named pid 1 for an attempt the history rightly gave the dead worker).
    """
    return _IMPORTED_UNDER


def action_of(plan: list[str], attempt: int) -> str:
    """The action ``plan`` gives attempt ``attempt`` (the last one for every later attempt)."""
    return plan[min(attempt, len(plan)) - 1]


def _attempt(
    ctx: JobContext, payload: dict[str, Any], record: Callable[..., None], pid: int | None = None
) -> object:
    action = action_of(payload["plan"], ctx.attempt)
    pid = os.getpid() if pid is None else pid
    key = payload.get("k")
    error: Exception | None = None
    grouped: bool | None = None
    try:
        grouped = isinstance(ctx.session, GroupSession)  # made now; it connects when first used
    except Exception as exc:
        error = exc
    record(
        starts,
        job_id=ctx.job_id,
        attempt=ctx.attempt,
        pid=pid,
        queue=ctx.queue,
        task=ctx.task,
        key=None if key is None else str(key),
        claimed_at=sa.select(jobs_table.c.started_at)
        .where(jobs_table.c.id == ctx.job_id, jobs_table.c.attempts == ctx.attempt)
        .scalar_subquery(),
        grouped=grouped,
    )
    if error is None:
        try:
            ctx.session.execute(
                effects.insert().values(job_id=ctx.job_id, attempt=ctx.attempt, pid=pid)
            )
        except Exception as exc:
            error = exc
    if error is not None:
        record(
            ends,
            job_id=ctx.job_id,
            attempt=ctx.attempt,
            action=action,
            pid=pid,
            error=f"{type(error).__module__}.{type(error).__name__}: {error}"[:500],
            unusable=unusable(error),
        )
        raise error
    if action == "slow":
        time.sleep(SLOW)
    elif action == "long":
        time.sleep(LEASES[ctx.task].total_seconds() * 1.5)
    elif action == "hold":
        deadline = time.monotonic() + HOLD
        while not ctx.cancel_requested and time.monotonic() < deadline:
            time.sleep(0.05)
    record(ends, job_id=ctx.job_id, attempt=ctx.attempt, action=action, pid=pid)
    if action == "fail":
        raise RuntimeError(f"planned failure of attempt {ctx.attempt}")
    if action == "retry":
        raise Retry(after=RETRY_AFTER)
    if action == "discard":
        raise Discard("planned discard")
    return {"n": payload["n"]}


def batched(ctx: BatchContext, jobs: list[BatchJob[dict[str, Any]]]) -> None:
    """A batch: each job's attempt does its plan's action, as :func:`work` does for one job.

    The starts of the batch's attempts are recorded in one statement; then an effect row is
    written through the batch's ``ctx.session`` (one INSERT) for each job whose action may
    succeed (``fail``, ``retry`` and ``discard`` are given to the job alone, with
    ``ctx.fail``, ``ctx.retry`` and ``ctx.discard``, and get no row, as the batch tasks
    how-to says to do); then the batch sleeps for its longest action (``slow``, ``long``,
    ``hold`` waiting for ``ctx.stop_requested``), records every job's end, and raises if
    any job's action is ``crash`` (every job of the batch fails, nothing it wrote commits).
    """
    pid = os.getpid()
    actions = {job.id: action_of(job.payload["plan"], job.attempt) for job in jobs}
    batch = f"{pid}:{jobs[0].id}:{jobs[0].attempt}"
    _record_many(
        starts,
        [
            {
                "job_id": job.id,
                "attempt": job.attempt,
                "pid": pid,
                "queue": ctx.queue,
                "task": ctx.task,
                "key": None if job.payload.get("k") is None else str(job.payload["k"]),
                "claimed_at": sa.select(jobs_table.c.started_at)
                .where(jobs_table.c.id == job.id, jobs_table.c.attempts == job.attempt)
                .scalar_subquery(),
                "grouped": False,
                "batch": batch,
            }
            for job in jobs
        ],
    )
    rows = []
    for job in jobs:
        action = actions[job.id]
        if action == "fail":
            ctx.fail(job, RuntimeError(f"planned failure of attempt {job.attempt}"))
        elif action == "retry":
            ctx.retry(job, after=RETRY_AFTER)
        elif action == "discard":
            ctx.discard(job, "planned discard")
        else:
            rows.append({"job_id": job.id, "attempt": job.attempt, "pid": pid})
    error: Exception | None = None
    try:
        if rows:
            ctx.session.execute(effects.insert(), rows)
    except Exception as exc:
        error = exc
    done = set(actions.values())
    if error is None:
        if "long" in done:
            time.sleep(LEASES[ctx.task].total_seconds() * 1.5)
        elif "hold" in done:
            deadline = time.monotonic() + HOLD
            while not ctx.stop_requested and time.monotonic() < deadline:
                time.sleep(0.05)
        elif "slow" in done:
            time.sleep(SLOW)
    text = None if error is None else f"{type(error).__module__}.{type(error).__name__}: {error}"
    _record_many(
        ends,
        [
            {
                "job_id": job.id,
                "attempt": job.attempt,
                "action": actions[job.id],
                "pid": pid,
                "error": None if text is None else text[:500],
                "unusable": None if error is None else unusable(error),
            }
            for job in jobs
        ],
    )
    if error is not None:
        raise error
    if "crash" in done:
        raise RuntimeError("planned failure of the batch")


def _record_many(table: sa.Table, rows: list[dict[str, Any]]) -> None:
    """:func:`_record` of many rows, in one statement."""
    for tries in (1, 2):
        try:
            with _audit().begin() as conn:
                conn.execute(table.insert().values(rows))
            return
        except sa.exc.DBAPIError:
            if tries == 2:
                raise


def _declare(name: str, lease: timedelta = LEASE, handler: Any = work, **options: Any) -> None:
    queue.task(name=name, lease=lease, backoff=BACKOFF, max_attempts=3, **options)(handler)
    LEASES[name] = lease
    if options.get("keep_result"):
        KEEPS.add(name)
    if handler is quick:
        LATE.add(name)
    if options.get("hard_timeout"):
        LIMITED.add(name)
    if options.get("on_error"):
        CALLING.add(name)


def on_dead(ctx: JobContext, payload: dict[str, Any]) -> None:
    """The error callback: a job of it is enqueued by the statement that moves a job of a task
    declared with ``on_error`` to dead (revision sajq_0019); what it is given is checked at
    quiescence (``invariants.error_callbacks``), so it does nothing."""


#: The error callback task, and the tasks whose deaths enqueue a job of it.
CALLBACK: Final = "on_dead"
_callback = queue.task(name=CALLBACK, lease=LEASE, max_attempts=3)(on_dead)
CALLING: set[str] = set()

_declare("plain", on_error=_callback)
_declare("kept", queue="q1", keep_result=True)
_declare("brief", lease=SHORT_LEASE, queue="q2", on_error=_callback)
_declare("keyed", unique_key=lambda p: p.get("uk"))
_declare("replacing", unique_key=lambda p: p.get("uk"), unique_mode="replace", keep_result=True)
_declare("periodic_key", unique_key=lambda p: p.get("uk"), unique_period=timedelta(seconds=2))
_declare("quick", handler=quick)
_declare("typed", handler=typed, queue="q1")
_declare("limited", handler=limited, hard_timeout=HARD_LIMIT)

queue.batch_task(
    name="batched",
    max_size=BATCH_SIZE,
    max_wait=timedelta(milliseconds=200),
    batch_key="k",
    lease=LEASE,
    backoff=BACKOFF,
    max_attempts=3,
)(batched)
LEASES["batched"] = LEASE
BATCHES["batched"] = BATCH_SIZE

#: The tasks a schedule draws from.
TASKS = tuple(LEASES)
