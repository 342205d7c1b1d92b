"""Task declarations: :class:`Task`, and what a handler raises to retry or discard its job.

The context a handler receives, :class:`JobContext`, is defined in ``_context``, the retry
policy, :class:`Backoff`, in ``_backoff``; both are public here too."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic

from typing_extensions import TypeVar

if TYPE_CHECKING:
    from .batching import Batching

from ._backoff import Backoff as Backoff  # public here too: sa_jobqueue.tasks.Backoff
from ._backoff import check_backoff
from ._context import JobContext as JobContext  # public here too: sa_jobqueue.tasks.JobContext
from ._durations import duration_text
from ._payload_types import PayloadCodec, codec_for
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
