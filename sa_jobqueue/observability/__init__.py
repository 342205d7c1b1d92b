"""What a worker tells observers about its jobs; metrics, traces and logs hang off these hooks.

A :class:`Worker` calls each of its observers at every transition of an attempt::

    started ──► running(...) around the handler ──► finished(outcome)

``finished`` comes once per attempt, when its outcome is recorded in the database (for a
batched completion, after the batch's statement), with one of :data:`OUTCOMES`:

* ``succeeded``: the completion (and the handler's writes) committed.
* ``retried``: the attempt failed and the job is queued again after its backoff.
* ``dead``: the attempt failed and no attempt is left (or the job cannot run at all).
* ``cancelled``: the job was cancelled while it ran.
* ``lost``: the attempt lost its lease (its worker stalled, or its outcome could not be
  recorded); another attempt will run, or has run, elsewhere.
* ``handed_back``: the attempt's work was rolled back with the transaction it shared with
  other jobs, and the job was returned to the queue uncounted.

An observer's exception is logged and otherwise ignored: observing never changes a job's fate.
Hooks run on the worker's threads, so they must be quick and thread-safe.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

log = logging.getLogger("sa_jobqueue.worker")

OUTCOMES: Final = ("succeeded", "retried", "dead", "cancelled", "lost", "handed_back")


@dataclass(frozen=True, slots=True)
class JobRun:
    """One attempt of a job, as observers see it."""

    id: int
    task: str
    queue: str
    attempt: int
    max_attempts: int
    #: The W3C trace context recorded when the job was enqueued with tracing on, else None.
    trace_context: Mapping[str, str] | None = None


class Observer:
    """Base class for observers: every hook does nothing; override the ones you need."""

    def started(self, job: JobRun) -> None:
        """The attempt's handler is about to run (on the thread that will run it)."""

    @contextlib.contextmanager
    def running(self, job: JobRun) -> Iterator[None]:
        """Wraps the handler's call (a tracing span, say); exceptions pass through it."""
        yield

    def finished(
        self, job: JobRun, outcome: str, run_time: float | None, error: BaseException | None
    ) -> None:
        """The attempt's outcome is recorded. ``run_time``: the handler's, in seconds."""

    def lease_lost(self, job: JobRun) -> None:
        """The heartbeat found the attempt's lease taken over while its handler ran."""


class Observers(Observer):
    """Several observers as one; each hook reaches them all, and none can break a job."""

    def __init__(self, observers: Sequence[Observer]) -> None:
        self.observers = list(observers)

    def __bool__(self) -> bool:
        return bool(self.observers)

    def _each(self, hook: str, *args: Any) -> None:
        for observer in self.observers:
            try:
                getattr(observer, hook)(*args)
            except Exception:
                log.exception("observer %r failed in %s", observer, hook)

    def started(self, job: JobRun) -> None:
        self._each("started", job)

    @contextlib.contextmanager
    def running(self, job: JobRun) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for observer in self.observers:
                try:
                    stack.enter_context(observer.running(job))
                except Exception:
                    log.exception("observer %r failed in running", observer)
            yield

    def finished(
        self, job: JobRun, outcome: str, run_time: float | None, error: BaseException | None
    ) -> None:
        self._each("finished", job, outcome, run_time, error)

    def lease_lost(self, job: JobRun) -> None:
        self._each("lease_lost", job)
