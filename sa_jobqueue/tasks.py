"""Task declarations and the context a handler receives (the retry policy, :class:`Backoff`,
is defined in ``_backoff``)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, Generic

from sqlalchemy.orm import Session
from typing_extensions import TypeVar

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from .batching import Batching

from ._backoff import Backoff as Backoff  # public here too: sa_jobqueue.tasks.Backoff
from ._backoff import check_backoff
from ._durations import duration_text
from ._payload_types import PayloadCodec, codec_for
from ._progress import ProgressReport, check_progress
from ._sql import admin as admin_sql
from ._sql import dependencies as dependencies_sql
from ._validation import (
    UniqueMode,
    check_lease,
    check_max_attempts,
    check_meta,
    check_priority,
    check_queue_name,
    check_run_at,
    check_tags,
    check_task_name,
    check_timeout,
    check_unique_mode,
    check_unique_period,
)
from .errors import InvalidJobError, TaskDefinitionError

Handler = Callable[["JobContext", Any], object]

#: A task's payload type: what its handler's second parameter is annotated with (Any when it
#: is not annotated). The default lets a bare ``Task`` mean ``Task[Any]``.
P = TypeVar("P", default=Any)


class Retry(Exception):
    """Raised by a handler: run this job again ``after`` from now, without counting a failure.

    The attempt that raised it stays counted (every attempt is counted when it is claimed),
    but no error is recorded, the task's backoff is not applied, and the job never runs out
    of attempts this way: when no attempt would be left, ``max_attempts`` grows by one. The
    handler's writes through ``ctx.session`` are rolled back, as for any exception.
    """

    def __init__(self, after: timedelta = timedelta(0), reason: str = "") -> None:
        if not isinstance(after, timedelta) or after < timedelta(0):
            raise TypeError("Retry(after=...) takes a timedelta of zero or more")
        super().__init__(reason or f"retry in {duration_text(after)}")
        self.after = after
        self.reason = reason

    def __reduce__(self) -> tuple[type[Retry], tuple[timedelta, str]]:
        # Pickled as its arguments (the default would call Retry(message)): an attempt run
        # in a child process sends it to its worker.
        return (type(self), (self.after, self.reason))


class Discard(Exception):
    """Raised by a handler: give this job up now; it goes to ``dead`` with ``reason``.

    No later attempt runs, whatever attempts are left. The reason is kept in ``last_error``
    (type ``sa_jobqueue.tasks.Discard``), and the job can be requeued like any dead job. The
    handler's writes through ``ctx.session`` are rolled back. A job whose cancellation was
    requested (``ctx.cancel_requested``) ends ``cancelled`` instead, as ``JobQueue.cancel``
    promises, with the reason still kept.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Task(Generic[P]):
    """A registered task: a handler and its defaults. Calling it calls the handler directly.

    ``timeout`` bounds one attempt: once it has run that long, the attempt is recorded as
    failed (``TimeoutError``; retried after its backoff, or dead when out of attempts), its
    lease is no longer renewed, and ``ctx.stop_requested`` turns True. Python cannot stop a
    running thread, so a sync handler must look at ``ctx.stop_requested`` between steps of
    long work and return (or raise); whatever it does after the timeout cannot complete the
    job, and its ``ctx.session`` writes roll back.

    ``hard_timeout`` kills an attempt that runs that long: each attempt then runs in a child
    process of its own (sync handlers defined at a module's top level only), which its worker
    kills (SIGKILL) at the limit, terminating its server session so that its ``ctx.session``
    writes roll back and its row locks go at once; the attempt is recorded as failed with
    :class:`~sa_jobqueue.errors.HardTimeoutError` and retried under the task's policy. The child
    also kills itself at the limit should its worker be stopped, and dies with its worker. A
    cancellation, a lost lease or a passed ``timeout`` kills it too. It costs a process start
    per attempt (tens of milliseconds): it is for long jobs that must not overrun. Middleware
    runs in the worker, around the child's attempt, and must not use ``ctx.session`` there.

    ``unique_key``, if given, maps a payload to the job's unique key (a str, or None for no
    uniqueness): while a waiting, queued or running job of this task holds a key, enqueueing
    another job with that key adds nothing and returns the live job's id (see
    ``JobQueue.enqueue``).
    ``unique_mode`` says what such an enqueue does to a queued holder (see :data:`UniqueMode`),
    ``debounce`` is the delay a ``"debounce"`` enqueue gives the job when it names no
    ``run_at``, and ``unique_period`` also holds a key for the rest of the fixed window of that
    length in which its job was enqueued, after the job has finished.

    ``tags`` and ``meta`` are kept with every job of the task: an enqueue's tags are added to
    the task's (in order, without repeats), and the keys of an enqueue's meta go over the
    task's (a shallow merge). See ``JobQueue.enqueue`` and the tags how-to.

    ``keep_result``: the handler's return value is stored with the job's completion (in the
    same fenced statement, so a stale attempt stores nothing), as JSON under the rules and
    size cap of payloads, and read back with ``JobQueue.get_result`` or waited for with
    ``JobQueue.wait_for_result``. A value that cannot be stored (not JSON, or over the size
    cap) moves the job to dead at once with :class:`~sa_jobqueue.errors.PayloadError`: no
    retry, since every attempt's result would be refused alike.

    The handler is called as ``handler(ctx, payload)``; one that cannot be called that way
    (too few or too many required parameters, a required keyword-only one) is refused with
    TaskDefinitionError here, not at its first run. What the handler does with its arguments
    is not checked.

    A handler whose payload parameter is annotated with a dataclass, a ``TypedDict`` or a
    Pydantic model takes a typed payload (:attr:`payload_type`): ``enqueue`` checks the payload
    against the type (PayloadTypeError before any SQL) and stores it as JSON, and the worker
    rebuilds a value of the type before the handler runs; ``unique_key`` gets that value too.
    Pydantic does this (the ``pydantic`` extra): without it, such a handler is refused here with
    TaskDefinitionError. See the typed payloads how-to for the types and the strictness rule.
    """

    name: str
    handler: Callable[[JobContext, P], object]
    queue: str = "default"
    priority: int = 0
    max_attempts: int = 5
    lease: timedelta = timedelta(seconds=30)
    backoff: Backoff = field(default_factory=Backoff)
    timeout: timedelta | None = None
    unique_key: Callable[[Any], str | None] | None = None
    unique_mode: UniqueMode = "skip"
    unique_period: timedelta | None = None
    debounce: timedelta | None = None
    keep_result: bool = False
    hard_timeout: timedelta | None = None
    #: Tags every job of the task carries (a list or tuple; kept as a tuple).
    tags: tuple[str, ...] = ()
    #: Meta every job of the task carries, under the keys an enqueue gives (a JSON object).
    meta: dict[str, Any] | None = field(default=None, hash=False)
    #: The error callback: a task a job of this task enqueues a job of when it dies (see
    #: "Error callbacks" in the tasks how-to); declared before this one. None: none.
    on_error: Task[Any] | None = None
    #: How a batch task forms its batches (``JobQueue.batch_task``); None for a task whose
    #: handler takes one job at a time.
    batching: Batching | None = None
    #: How typed payloads are checked and rebuilt; None for a plain JSON payload. Made from
    #: the handler's annotation (see :attr:`payload_type`).
    payload_codec: PayloadCodec | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.on_error is not None and not isinstance(self.on_error, Task):
            raise TaskDefinitionError(
                f"task {self.name!r}: on_error is a Task (declared before this one), not"
                f" {self.on_error!r}"
            )
        if not isinstance(self.keep_result, bool):
            raise TaskDefinitionError(f"task {self.name!r}: keep_result must be True or False")
        if self.debounce is not None and self.unique_mode != "debounce":
            raise TaskDefinitionError(
                f"task {self.name!r}: debounce is the delay of unique_mode='debounce'"
            )
        if self.unique_key is not None and not callable(self.unique_key):
            raise TaskDefinitionError(
                f"task {self.name!r}: unique_key must be a function of the payload"
            )
        try:
            check_task_name(self.name)
            check_queue_name(self.queue)
            check_priority(self.priority)
            check_max_attempts(self.max_attempts)
            check_lease(self.lease)
            check_backoff(self.backoff)
            check_timeout(self.timeout)
            check_timeout(self.hard_timeout, "hard_timeout")
            check_unique_mode(self.unique_mode)
            check_unique_period(self.unique_period)
            if self.debounce is not None:
                check_run_at(self.debounce)
            object.__setattr__(self, "tags", check_tags(self.tags))
            check_meta(self.meta)
            object.__setattr__(self, "meta", dict(self.meta) if self.meta else None)
        except InvalidJobError as exc:
            raise TaskDefinitionError(f"task {self.name!r}: {exc}") from exc
        _check_handler(self.name, self.handler)
        if self.hard_timeout is not None:
            if self.batching is not None:
                raise TaskDefinitionError(
                    f"task {self.name!r}: hard_timeout is for tasks that take one job at a"
                    " time, not for batch tasks"
                )
            _check_isolatable(self.name, self.handler)
        if self.batching is not None:
            self.batching.check(self.name, self.lease)
        codec = codec_for(self.name, self.handler, batch=self.batching is not None)
        object.__setattr__(self, "payload_codec", codec)

    @property
    def payload_type(self) -> type | None:
        """The dataclass, TypedDict or Pydantic model the handler's payload is annotated
        with; None when the payload is plain JSON (any other annotation, or none)."""
        return None if self.payload_codec is None else self.payload_codec.type

    def __call__(self, ctx: JobContext, payload: P) -> object:
        return self.handler(ctx, payload)


def _check_isolatable(name: str, handler: object) -> None:
    """Refuse a hard-limited handler its attempt's child process could not run: an ``async
    def`` one, or one it could not import (it is found there by module and qualified name)."""
    if inspect.iscoroutinefunction(handler):
        raise TaskDefinitionError(
            f"task {name!r}: hard_timeout runs each attempt in a child process, for sync"
            " handlers; an async handler is cancelled at its timeout instead"
        )
    qualname = getattr(handler, "__qualname__", "")
    if not getattr(handler, "__module__", None) or "<" in qualname:
        raise TaskDefinitionError(
            f"task {name!r}: hard_timeout runs each attempt in a child process, which imports"
            " the handler by its module and name: define it at the top level of a module"
            f" ({qualname or type(handler).__name__} is not)"
        )


def _check_handler(name: str, handler: object) -> None:
    """Refuse a handler that cannot be called as ``handler(ctx, payload)``."""
    if not callable(handler):
        raise TaskDefinitionError(
            f"task {name!r}: the handler must be a function, not {type(handler).__name__}"
        )
    try:
        signature = inspect.signature(handler)  # follows functools.wraps to the wrapped one
    except (TypeError, ValueError):
        return  # some builtins and extension callables have none: nothing to check
    try:
        signature.bind(None, None)
    except TypeError as exc:
        label = getattr(handler, "__qualname__", type(handler).__name__)
        raise TaskDefinitionError(
            f"task {name!r}: the handler is called as handler(ctx, payload), which"
            f" {label}{signature} cannot take ({exc})"
        ) from None


class JobContext:
    """What a handler receives besides its payload.

    ``session`` is a Session whose transaction the worker commits together with the job's
    completion: write through it and your writes happen exactly once, or not at all (a retry
    starts from a clean slate, and an attempt that lost its lease has its writes rolled back).
    Do not commit it yourself. Work done outside it (HTTP calls, e-mails, other connections)
    may happen more than once: execution is at-least-once.

    From the job's row, as the claim returned it (no query of their own): ``job_id``, ``task``,
    ``queue``, ``attempt`` (this attempt's number, from 1), ``max_attempts``, ``created_at``
    (when the job was enqueued: a timezone-aware datetime by the database's clock; compare it
    with the database's ``now()``, not the worker's clock, to know the job's age) and
    ``priority`` (lower runs first; give it to the jobs the handler enqueues to keep a flow's
    priority). They are not read again during the attempt: a change to the row meanwhile
    shows only as ``cancel_requested``. A context made by hand (in a test) has ``created_at``
    now unless given, and ``priority`` 0.

    :meth:`report_progress` keeps a progress for the job's row, written by the worker's
    heartbeat without a statement of its own.
    """

    __slots__ = (
        "_async_session",
        "_async_session_factory",
        "_cancel",
        "_forward_progress",
        "_progress",
        "_progress_written",
        "_session",
        "_session_factory",
        "_shutdown",
        "_stop",
        "attempt",
        "created_at",
        "job_id",
        "max_attempts",
        "priority",
        "queue",
        "task",
    )

    def __init__(
        self,
        *,
        job_id: int,
        task: str,
        queue: str,
        attempt: int,
        max_attempts: int,
        session: Session | Callable[[], Session],
        async_session: AsyncSession | Callable[[], AsyncSession] | None = None,
        created_at: datetime | None = None,
        priority: int = 0,
    ) -> None:
        self.job_id = job_id
        self.task = task
        self.queue = queue
        self.attempt = attempt
        self.max_attempts = max_attempts
        self.created_at = datetime.now(UTC) if created_at is None else created_at
        self.priority = priority
        # The worker passes a factory: a handler that never looks at its session costs none.
        self._session: Session | None = None
        self._session_factory: Callable[[], Session] | None = None
        if isinstance(session, Session):
            self._session = session
        else:
            self._session_factory = session
        self._async_session: AsyncSession | None = None
        self._async_session_factory: Callable[[], AsyncSession] | None = None
        if callable(async_session):
            self._async_session_factory = async_session
        else:
            self._async_session = async_session
        # Plain flags, set by the worker's heartbeat thread and read by the handler's.
        self._stop = False
        self._cancel = False
        self._shutdown = False  # set by the worker as it shuts down
        # The latest report (set by the handler's thread), and the one the heartbeat last
        # wrote or gave up on (set by the heartbeat's thread): see sa_jobqueue/_progress.py.
        self._progress: ProgressReport | None = None
        self._progress_written: ProgressReport | None = None
        # Where a child process running the attempt (hard_timeout) sends each report.
        self._forward_progress: Callable[[ProgressReport], None] | None = None

    def __repr__(self) -> str:
        return (
            f"JobContext(job_id={self.job_id}, task={self.task!r}, queue={self.queue!r},"
            f" attempt={self.attempt}/{self.max_attempts})"
        )

    @property
    def session(self) -> Session:
        """The Session to write through (created on first use)."""
        if self._session is None:
            assert self._session_factory is not None
            self._session = self._session_factory()
        return self._session

    @property
    def async_session(self) -> AsyncSession:
        """The AsyncSession an ``async def`` handler writes through (created on first use).

        Its transaction commits with the job's fenced completion, as ``session``'s does for a
        sync handler; do not commit it yourself. Only an async handler run by a worker has
        one.
        """
        if self._async_session is None:
            if self._async_session_factory is None:
                raise RuntimeError("only an async def handler run by a worker has async_session")
            self._async_session = self._async_session_factory()
        return self._async_session

    @property
    def async_session_used(self) -> bool:
        """Whether the handler asked for its async session at all."""
        return self._async_session is not None

    @property
    def session_used(self) -> bool:
        """Whether the handler asked for its session at all."""
        return self._session is not None

    def upstream_results(self) -> dict[int, Any]:
        """What the jobs this one waited for returned (``depends_on``, a chain's step before, a
        chord's group), by job id in id order: each one's stored result (None for a task that
        keeps none). Read through :attr:`session`, in the job's transaction."""
        rows = self.session.execute(dependencies_sql.upstream_results(), {"job_id": self.job_id})
        return {job_id: result for job_id, result in rows}

    async def aupstream_results(self) -> dict[int, Any]:
        """:meth:`upstream_results` for an ``async def`` handler, through
        :attr:`async_session`."""
        query = dependencies_sql.upstream_results()
        rows = await self.async_session.execute(query, {"job_id": self.job_id})
        return {job_id: result for job_id, result in rows}

    def tags_and_meta(self) -> tuple[list[str], dict[str, Any]]:
        """The job's tags and meta (``[]`` and ``{}`` when it has none), read through
        :attr:`session`: one lookup by primary key, in the job's transaction.

        Not part of the claim: every job would carry them to its worker whether its handler
        looks at them or not, so only a handler that asks pays for them. They are read as
        they are now; nothing changes them after enqueue but a hand-written UPDATE.
        """
        row = self.session.execute(_TAGS_AND_META, {"job_id": self.job_id}).one_or_none()
        return _labels(row)

    async def atags_and_meta(self) -> tuple[list[str], dict[str, Any]]:
        """:meth:`tags_and_meta` for an ``async def`` handler, through :attr:`async_session`."""
        result = await self.async_session.execute(_TAGS_AND_META, {"job_id": self.job_id})
        return _labels(result.one_or_none())

    def report_progress(self, fraction: float, message: str | None = None) -> None:
        """Say how far the job has got: ``fraction`` from 0 to 1, and an optional message.

        Shown by ``sa-jobqueue jobs show``, the dashboard's job page and its API, and
        ``JobQueue.get_job``. The call only keeps the report in memory (no statement, no lock)
        and returns at once; the worker writes the latest report with its next lease renewal,
        which a report brings forward to at most ``PROGRESS_INTERVAL`` (2 s) after the last
        one, however often the handler reports. A report replaces the last one whole: a
        report without a message clears the message.

        A fraction that is not a finite number from 0 to 1, or a message longer than 200
        characters or that the database could not store, raises
        :class:`~sa_jobqueue.errors.InvalidProgressError` here (a bug in the handler, which
        fails the attempt like any other exception unless the handler catches it).

        What it does not promise: that every report is written (only the latest one at each
        renewal is), nor that the last one is: the completion writes none, so a job that
        finishes between two renewals keeps the progress the last renewal wrote, or none. A
        failed write never reaches the handler: the report is dropped and the leases renewed
        without it. Progress is not fenced at the call, only at the write: an attempt that
        lost its lease writes nothing. The next attempt of the job starts with no progress.
        """
        report = check_progress(fraction, message)
        self._progress = report  # one reference, replaced whole: see _progress.py
        forward = self._forward_progress
        if forward is not None:
            forward(report)

    @property
    def progress(self) -> tuple[float, str | None] | None:
        """The latest report of this attempt as ``(fraction, message)``; None before any."""
        return self._progress

    @property
    def stop_requested(self) -> bool:
        """True once this attempt should stop early.

        Its lease was lost (it expired, or the job was claimed again), it ran past its
        timeout, or the job was cancelled: nothing it does afterwards can complete the job,
        but for one case: a lease that merely expired, with no worker having claimed the job
        again yet (the fence names the attempt, not the lease), completes it. Or its worker is
        shutting down (SIGTERM, ``stop()``): then returning completes the job as usual, and
        raising hands it back to the queue with this attempt uncounted and its ``session``
        writes rolled back, to run again at once on another worker (``Retry`` and ``Discard``
        still do what they say).
        """
        return self._stop or self._shutdown

    @property
    def cancel_requested(self) -> bool:
        """True once ``JobQueue.cancel`` was called for this job (seen at a lease renewal)."""
        return self._cancel


_TAGS_AND_META: Final = admin_sql.job_by_id(("tags", "meta"))


def _labels(row: Any) -> tuple[list[str], dict[str, Any]]:
    if row is None:
        return [], {}
    tags, meta = row
    return list(tags or ()), dict(meta) if isinstance(meta, dict) else {}
