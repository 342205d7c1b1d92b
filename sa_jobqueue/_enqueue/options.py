"""The enqueue options, defined once, and their resolution against a task's declaration.

:class:`JobOptions` names the options every enqueue takes, each documented there once.
``JobQueue.enqueue`` and ``enqueue_many`` (and their async forms) take them as
``**options: Unpack[EnqueueOptions]`` (``EnqueueManyOptions``), so an editor completes them and
mypy checks each keyword. :func:`resolve_options` reads the option names from
:class:`JobOptions` itself and checks each value with its checker in :data:`CHECKS`: adding an
option is a key of :class:`JobOptions`, its checker and a field of :class:`ResolvedOptions`
(``tests/unit/test_enqueue_options.py`` checks that the three agree).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, TypedDict, Unpack

from .._backoff import Backoff, check_backoff
from .._validation import (
    UniqueMode,
    check_lease,
    check_max_attempts,
    check_meta,
    check_priority,
    check_queue_name,
    check_run_at,
    check_tags,
    check_unique_mode,
    check_unique_period,
)
from ..errors import InvalidJobError
from ..tasks import Task

if TYPE_CHECKING:
    from ..workflows import Dependency


class JobOptions(TypedDict, total=False):
    """Where, when and how the jobs of an enqueue run: options of ``enqueue`` and its kin.

    Each option left out, or given as None, is the task's declaration (see
    :meth:`~sa_jobqueue.JobQueue.task`). A bad value raises an
    :class:`~sa_jobqueue.errors.InvalidJobError` subclass naming the option before any SQL is
    sent; an unknown option name raises TypeError, as for any function. Middleware sees the
    options a call gave as such a dict (:attr:`sa_jobqueue.middleware.Enqueueing.options`).
    """

    run_at: datetime | timedelta | None
    """When the job is due: a timezone-aware datetime, or a timedelta counted from the
    database's ``now()``. Left out, the job is due at once (a debounced one after the task's
    ``debounce``)."""
    priority: int | None
    """Lower runs first, among the due jobs of a queue."""
    queue: str | None
    """The queue the job goes to (workers claim by queue)."""
    max_attempts: int | None
    """How many times the job may run before it is ``dead``."""
    lease: timedelta | None
    """How long a worker may go without renewing its claim before the job is taken from it
    and run elsewhere."""
    backoff: Backoff | None
    """The job's own retry delays: kept with the job and used for its retries instead of the
    task's."""
    unique_mode: UniqueMode | None
    """What an enqueue whose unique key is held does to the job holding it: ``"skip"`` leaves
    it as it is; ``"replace"`` gives it, if it is queued, this call's payload, priority and due
    time; ``"debounce"`` does the same but never moves its due time earlier. A waiting or
    running job is never changed."""
    unique_period: timedelta | None
    """Hold a unique key for the rest of the fixed window of this length its job was enqueued
    in, even once the job has finished (whole seconds)."""
    tags: Sequence[str] | None
    """Labels kept with the job, added to the task's (in order, without repeats): at most 16
    in all, each 1 to 64 characters from A-Z a-z 0-9 _ . : -, starting with a letter or digit.
    ``sa-jobqueue jobs list --tag``, the dashboard and the API filter by them; the worker
    never reads them."""
    meta: Mapping[str, Any] | None
    """A JSON object kept with the job and shown with it: its keys go over the task's meta (a
    shallow merge); at most 4,096 bytes of JSON in all, under the rules of payloads. For
    people and tools: the handler gets it only if it asks (``ctx.tags_and_meta()``)."""
    on_error: str | Task | Any | None
    """The error callback: a job enqueued in the statement that moves this job to ``dead``
    (each death enqueues one), given as a task, its name, or a
    :class:`~sa_jobqueue.workflows.Call` (its payload, a JSON object or None, is given the
    keys ``job_id``, ``task``, ``error``, ``attempts`` and ``workflow_id`` of the dead job;
    its options ``queue``, ``priority``, ``max_attempts``, ``lease``). Left out: the task's
    ``on_error``. See "Error callbacks" in the tasks how-to."""


class EnqueueOptions(JobOptions, total=False):
    """What :meth:`~sa_jobqueue.JobQueue.enqueue` takes besides the task and payload: the
    :class:`JobOptions`, a unique key and dependencies."""

    unique_key: str | None
    """While a waiting, queued or running job of the same task holds this key, nothing is added
    and the returned id is that job's, with ``.created`` False (``.updated`` True if
    ``unique_mode`` changed it). A job that has finished holds no key, unless a
    ``unique_period`` holds it. Left out: the task's ``unique_key(payload)``, if it declares
    one. Under REPEATABLE READ or SERIALIZABLE, a key taken by a transaction that committed
    after yours began raises a serialization error instead (retry the transaction). See the
    unique jobs how-to for the whole story."""
    depends_on: Sequence[int | Dependency] | None
    """Job ids (or :class:`~sa_jobqueue.workflows.Dependency` edges) the job waits for: it is
    ``waiting`` until they have all ended, then runs; one that ends dead or cancelled cancels
    it unless its edge says ``on_failure="run"``. An id with no job raises UnknownJobError
    before the job is inserted. Under REPEATABLE READ or SERIALIZABLE, a dependency that
    changed after your transaction's snapshot raises a serialization error, at the enqueue or
    at commit: retry the transaction. See :mod:`sa_jobqueue.workflows`."""


class EnqueueManyOptions(JobOptions, total=False):
    """What :meth:`~sa_jobqueue.JobQueue.enqueue_many` takes besides the task and payloads:
    the :class:`JobOptions`, unique keys and dependencies."""

    unique_keys: Sequence[str | None] | None
    """One key per payload, as :attr:`EnqueueOptions.unique_key` (a None entry, or no list,
    leaves the key to the task's ``unique_key`` function). A payload whose key a live job holds
    gets that job's id (``.created`` False), and so does a later payload of the batch with the
    same key as an earlier one: it gets the earlier one's job. In replace and debounce modes
    the last payload of a key is the one kept, as if the payloads had been enqueued one after
    another."""
    depends_on: Sequence[int | Dependency] | None
    """As :attr:`EnqueueOptions.depends_on`, for every job of the batch."""


#: The names of the options, read from :class:`JobOptions`.
OPTION_NAMES: Final = JobOptions.__optional_keys__


def _with(check: Callable[[Any], Any], default: str) -> Callable[[Any, Task], Any]:
    """``check`` of the value given, or of the task's attribute ``default`` when it is None."""
    return lambda value, task: check(getattr(task, default) if value is None else value)


def _own_backoff(value: Any, task: Task) -> Backoff | None:
    # None leaves the task's policy, which is not stored with the job.
    check_backoff(value)
    return value  # type: ignore[no-any-return]


#: Each option's checker: ``(value given or None, task)`` to the checked, final value, or an
#: InvalidJobError subclass naming the option. In :class:`JobOptions`'s order, which is the
#: order they are checked in (the first bad one is named).
CHECKS: Final[dict[str, Callable[[Any, Task], Any]]] = {
    "run_at": lambda value, task: check_run_at(value),
    "priority": _with(check_priority, "priority"),
    "queue": _with(check_queue_name, "queue"),
    "max_attempts": _with(check_max_attempts, "max_attempts"),
    "lease": _with(check_lease, "lease"),
    "backoff": _own_backoff,
    "unique_mode": _with(check_unique_mode, "unique_mode"),
    "unique_period": _with(check_unique_period, "unique_period"),
    "tags": lambda value, task: check_tags(value, base=task.tags),
    "meta": lambda value, task: check_meta(value, base=task.meta),
    "on_error": lambda value, task: _callbacks(task.on_error if value is None else value),
}


@dataclass(frozen=True)
class Callback:
    """An error callback resolved to its task: the job a death enqueues, as the enqueuer
    made it from what it was given (a task, a name, a Call)."""

    task: Task
    payload: Mapping[str, Any] | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    def spec(self) -> dict[str, Any]:
        """The job to insert, as ``sa_jobqueue_on_error`` reads it (revision sajq_0019)."""
        resolved = resolve_options(self.task, **self.options)
        return {
            "task": self.task.name,
            "queue": resolved.queue,
            "priority": resolved.priority,
            "max_attempts": resolved.max_attempts,
            "lease": resolved.lease.total_seconds(),
            "payload": None if self.payload is None else dict(self.payload),
        }


def callback_of(value: Any) -> Callback:
    """``value`` as a Callback: a Task, or one already resolved; InvalidJobError otherwise."""
    if isinstance(value, Task):
        return Callback(value)
    if isinstance(value, Callback):
        return value
    raise InvalidJobError(f"on_error is a task, a task name or a Call, not {value!r}")


def _callbacks(value: Any) -> str | None:
    """The ``on_error`` column's JSON text for a job's own callback (``{"job": ...}``; a
    workflow's is added by :meth:`ResolvedOptions.with_workflow_callback`), or None."""
    if value is None:
        return None
    return json.dumps({"job": callback_of(value).spec()}, separators=(",", ":"))


@dataclass(frozen=True)
class ResolvedOptions:
    """Where, when and how the jobs of one enqueue run: checked, and final.

    Built by :func:`resolve_options` only. ``run_at`` is None (due now), an aware datetime or
    a delay from the database's ``now()``. ``backoff`` is the job's own retry policy if the
    call gave one (stored with the job); None leaves the task's, which is not stored.
    ``unique_mode`` and ``unique_period`` apply to the jobs that get a unique key. ``tags``
    are the task's and the call's together (empty: none, stored as NULL); ``meta`` is the
    merged object as the JSON text stored (None: none); ``on_error`` the error callbacks as the
    JSON text stored (see :class:`Callback`; None: none).
    """

    task: Task
    queue: str
    priority: int
    max_attempts: int
    lease: timedelta
    run_at: datetime | timedelta | None = None
    backoff: Backoff | None = None
    unique_mode: str = "skip"
    unique_period: timedelta | None = None
    tags: tuple[str, ...] = ()
    meta: str | None = None
    on_error: str | None = None

    @property
    def labelled(self) -> bool:
        """Whether the jobs carry tags, meta or error callbacks: their statements then bind
        all three."""
        return bool(self.tags) or self.meta is not None or self.on_error is not None

    def with_workflow_callback(self, callback: Callback) -> ResolvedOptions:
        """These options, the jobs also carrying their workflow's error callback."""
        specs = {} if self.on_error is None else json.loads(self.on_error)
        specs["workflow"] = callback.spec()
        return replace(self, on_error=json.dumps(specs, separators=(",", ":")))

    @property
    def period_seconds(self) -> int | None:
        """The unique period in whole seconds (checked to be whole), or None."""
        return None if self.unique_period is None else int(self.unique_period.total_seconds())

    @property
    def schedule(self) -> str:
        """How the job's due time is given to the statement: "now", "at" or "after"."""
        if isinstance(self.run_at, datetime):
            return "at"
        return "after" if isinstance(self.run_at, timedelta) else "now"

    @functools.cached_property
    def row_params(self) -> Mapping[str, Any]:
        """:meth:`params` without a prefix, built once (a ResolvedOptions never changes, and
        a task's defaults are resolved once): copy it before adding to it."""
        return self.params()

    def params(self, prefix: str = "") -> dict[str, Any]:
        """The job's bind parameters (names after ``prefix``; ``run_at``/``delay`` never take it).

        ``lease`` and ``delay`` are seconds (see :func:`sa_jobqueue._sql.clock.seconds`).
        """
        params: dict[str, Any] = {
            f"{prefix}task": self.task.name,
            f"{prefix}queue": self.queue,
            f"{prefix}priority": self.priority,
            f"{prefix}max_attempts": self.max_attempts,
            f"{prefix}lease": self.lease.total_seconds(),
        }
        if self.labelled:
            params[f"{prefix}tags"] = list(self.tags) or None
            params[f"{prefix}meta"] = self.meta
            params[f"{prefix}on_error"] = self.on_error
        if isinstance(self.run_at, datetime):
            params["run_at"] = self.run_at
        elif isinstance(self.run_at, timedelta):
            params["delay"] = self.run_at.total_seconds()
        return params


def resolve_options(task: Task, /, **given: Unpack[JobOptions]) -> ResolvedOptions:
    """``task``'s defaults with the options ``given`` that are not None applied, each checked.

    In debounce mode, a job given no ``run_at`` is due the task's ``debounce`` delay from now.
    Raises an InvalidJobError subclass naming the first bad option, TypeError for a name that
    is no option; no I/O.
    """
    check_names(given)
    values = {name: check(given.get(name), task) for name, check in CHECKS.items()}
    if values["run_at"] is None and values["unique_mode"] == "debounce":
        values["run_at"] = check_run_at(task.debounce)
    return ResolvedOptions(task=task, **values)


def check_names(given: Mapping[str, Any]) -> None:
    """TypeError, before anything else, if ``given`` names what is no enqueue option."""
    if given.keys() <= OPTION_NAMES:
        return
    unknown = ", ".join(repr(name) for name in sorted(given.keys() - OPTION_NAMES))
    raise TypeError(f"unexpected enqueue option {unknown} (the options: {', '.join(CHECKS)})")
