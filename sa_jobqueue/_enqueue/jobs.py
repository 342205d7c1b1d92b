"""The jobs of one enqueue: checked and encoded before any I/O (:class:`NewJobs`), and what the
insert gives back for each (:class:`Enqueued`).

Payloads are encoded in one place, :func:`encode_payloads`, which :func:`new_jobs` calls.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .._payloads import encode_payload
from .._validation import check_unique_key
from ..errors import InvalidJobError
from ..tasks import Task
from .options import Callback, ResolvedOptions


class Enqueued(int):
    """A job's id, as ``enqueue`` returns it, with ``created``: whether this call added the job.

    It is an ``int`` (it compares, hashes, formats and serialises as the plain id), so code that
    takes the id as an int keeps working. ``created`` is False when the job's unique key was
    already held by a job of its task: the id is then that job's, and nothing was added.
    ``updated`` is True when, instead, this call gave that job (a queued one) its payload,
    priority and due time: the replace and debounce unique modes. Neither: the key's job was
    left as it was (skip mode, or a running or finished holder). Without a unique key,
    ``created`` is always True.
    """

    # A new job's flags, as class attributes: an instance holds its own only where they differ,
    # so the common id (see :func:`added`) costs one int.__new__ and no attribute.
    created: bool = True
    updated: bool = False

    def __new__(cls, job_id: int, created: bool = True, updated: bool = False) -> Enqueued:
        self = super().__new__(cls, job_id)
        if not created:
            self.created = False
        if updated:
            self.updated = True
        return self


def added(job_id: int) -> Enqueued:
    """``Enqueued(job_id)``, a job this call added, without the Python ``__new__``."""
    return int.__new__(Enqueued, job_id)


class Membership:
    """The workflow new jobs are inserted into, and their step's name (None: unnamed).

    ``callback``: the workflow's error callback, carried by every job inserted into it.
    ``workflow`` is the workflow's id, or what draws a new one: then the id is drawn when the
    first job goes into the workflow, after the enqueue middleware has run for it, so that a
    middleware that refuses the call finds nothing sent; later jobs get the same id.
    """

    __slots__ = ("_draw", "_id", "callback", "step")

    def __init__(
        self,
        workflow: int | Callable[[], int],
        step: str | None = None,
        callback: Callback | None = None,
    ) -> None:
        self._id = workflow if isinstance(workflow, int) else None
        self._draw = None if isinstance(workflow, int) else workflow
        self.step = step
        #: The workflow's error callback, carried by each of its jobs (see ``on_error``).
        self.callback = callback

    @property
    def workflow_id(self) -> int:
        """The workflow's id (drawn now if it was not given and not drawn yet)."""
        if self._id is None:
            assert self._draw is not None
            self._id = self._draw()
        return self._id


@dataclass(frozen=True)
class NewJobs:
    """Jobs of one task, checked and encoded, ready to insert: everything but the I/O.

    ``payloads`` are JSON texts; ``keys`` runs parallel to them (None: no uniqueness for that
    job), and ``unique`` says whether any of them is a key. ``trace_context`` is the
    enqueuer's W3C trace context as JSON text, for every job, when the queue traces and a
    trace is active (see :mod:`sa_jobqueue.observability.tracing`); else None.
    """

    options: ResolvedOptions
    payloads: list[str]
    keys: list[str | None]
    trace_context: str | None = None
    unique: bool = False

    @property
    def queue(self) -> str:
        return self.options.queue

    @property
    def task(self) -> str:
        return self.options.task.name

    def params(self, prefix: str = "") -> dict[str, Any]:
        """:meth:`ResolvedOptions.params` plus the trace context and the job's own backoff."""
        params = self.options.params(prefix) if prefix else dict(self.options.row_params)
        if self.trace_context is not None:
            params[f"{prefix}trace_context"] = self.trace_context
        if self.options.backoff is not None:
            params[f"{prefix}backoff"] = json.dumps(self.options.backoff.to_json())
        return params


def encode_payloads(
    task: Task, payloads: Sequence[Any], *, max_bytes: int
) -> tuple[Sequence[Any], list[str]]:
    """``task``'s ``payloads`` as its handler will get them, and as the JSON texts stored with
    its jobs; PayloadError if one cannot be stored. Every enqueue path encodes its payloads
    here, and only here.

    A task with a typed payload (``task.payload_codec``) checks each against its type first
    (PayloadTypeError) and makes it JSON; the payloads it gives back are then the typed values
    (a dataclass given as a dict, made one), which its ``unique_key`` function receives.
    """
    codec = task.payload_codec
    if codec is None:
        return payloads, [encode_payload(payload, max_bytes=max_bytes) for payload in payloads]
    prepared = [codec.prepare(payload) for payload in payloads]
    encoded = [encode_payload(data, max_bytes=max_bytes) for _, data in prepared]
    return [typed for typed, _ in prepared], encoded


def new_jobs(
    options: ResolvedOptions,
    payloads: Sequence[Any],
    unique_keys: Sequence[str | None] | None,
    *,
    max_payload_bytes: int,
    trace_context: Callable[[], str | None] | None = None,
) -> NewJobs:
    """Encode ``payloads`` and settle their keys; ``unique_keys`` runs parallel to them.

    For a None key (or no ``unique_keys`` at all) the task's ``unique_key`` function, if it
    declares one, gives the key; its errors propagate. ``trace_context`` is called last, once,
    if given. No I/O.
    """
    task = options.task
    payloads, encoded = encode_payloads(task, payloads, max_bytes=max_payload_bytes)
    if unique_keys is not None and len(unique_keys) != len(payloads):
        raise InvalidJobError(
            f"unique_keys has {len(unique_keys)} entries for {len(payloads)} payloads"
        )
    derive = task.unique_key
    keys: list[str | None]
    if derive is None and (unique_keys is None or all(key is None for key in unique_keys)):
        keys = [None] * len(payloads)  # no uniqueness: nothing to check per job
        unique = False
    else:
        given = [None] * len(payloads) if unique_keys is None else unique_keys
        keys = [
            check_unique_key(
                key if key is not None or derive is None else derive(payload), task=task.name
            )
            for payload, key in zip(payloads, given, strict=True)
        ]
        unique = any(key is not None for key in keys)
    trace = trace_context() if trace_context is not None else None
    return NewJobs(options, encoded, keys, trace, unique)
