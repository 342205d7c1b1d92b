"""The observer hooks: what an attempt looks like to them, the base class, and the fan-out.

The contract (which thread calls what, what a hook must not do) is written in the package's
docstring, :mod:`sa_jobqueue.observability`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

# The worker's logger: a failing observer is the worker's news, next to its other lines.
log = logging.getLogger("sa_jobqueue.worker")

#: Every outcome ``finished`` reports, in the order the package docstring explains them.
OUTCOMES: Final = ("succeeded", "retried", "dead", "cancelled", "lost", "handed_back")


@dataclass(frozen=True, slots=True)
class JobRun:
    """One attempt of a job, as observers see it.

    A snapshot taken when the attempt was claimed: it does not follow the job's row.
    """

    id: int
    task: str
    queue: str
    attempt: int
    max_attempts: int
    #: The W3C trace context recorded when the job was enqueued with tracing on, else None.
    trace_context: Mapping[str, str] | None = None


class Observer:
    """Base class for observers: every hook does nothing; override the ones you need.

    Hooks are called on the worker's own threads (see :mod:`sa_jobqueue.observability`):
    they must be quick, thread-safe, and must not block on I/O.
    """

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
        """The heartbeat found the attempt's lease expired or taken over while its handler ran.

        Its handler is asked to stop. The outcome that follows is usually ``lost``, but may be
        any other if the lease merely expired and no worker claimed the job again first.
        """


class Observers(Observer):
    """Several observers as one; each hook reaches them all, and none can break a job.

    An observer's exception is logged (``sa_jobqueue.worker``) and the next observer is
    called. False when empty, so the worker can skip building a :class:`JobRun` at all.
    """

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
