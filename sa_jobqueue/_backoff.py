"""The retry policy, in one place: :class:`Backoff` (what a task or an enqueue gives), which
policy an attempt's failure follows (:func:`policy_of`), and the delay it gives
(:func:`retry_delay`), with the fallbacks a worker uses when a stored or custom policy cannot
give one.

``Backoff`` is public as ``sa_jobqueue.Backoff`` (and ``sa_jobqueue.tasks.Backoff``).
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final

from ._durations import value_text
from .errors import InvalidJobError, TaskDefinitionError

log = logging.getLogger("sa_jobqueue.worker")


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff between attempts: ``base * 2**(attempt-1)``, capped, with jitter.

    ``jitter`` is a fraction: the delay is drawn uniformly from ``delay * (1 ± jitter)`` (and
    never above ``cap``), so jobs that failed together do not all come back together. Set
    ``jitter=0`` for an exact schedule.

    The delay is counted from the database's ``now()`` when the failure is recorded; it is the
    earliest moment of the next attempt, not a promise that it starts then.
    """

    base: timedelta = timedelta(seconds=1)
    cap: timedelta = timedelta(minutes=10)
    jitter: float = 0.1

    def __post_init__(self) -> None:
        for option in ("base", "cap"):
            value = getattr(self, option)
            if not isinstance(value, timedelta):
                raise TaskDefinitionError(
                    f"Backoff.{option} must be a timedelta, not {value_text(value)}"
                )
        if self.base <= timedelta(0) or self.cap < self.base:
            raise TaskDefinitionError("Backoff needs 0s < base <= cap")
        if (
            isinstance(self.jitter, bool)
            or not isinstance(self.jitter, int | float)
            or not 0 <= self.jitter <= 1
        ):
            raise TaskDefinitionError(
                f"Backoff.jitter is a fraction from 0 to 1, not {value_text(self.jitter)}"
            )

    def to_json(self) -> dict[str, float]:
        """The policy as stored with a job enqueued with it (seconds and a fraction)."""
        return {
            "base": self.base.total_seconds(),
            "cap": self.cap.total_seconds(),
            "jitter": self.jitter,
        }

    @classmethod
    def from_json(cls, stored: dict[str, float]) -> Backoff:
        """The policy :meth:`to_json` stored."""
        return cls(
            base=timedelta(seconds=stored["base"]),
            cap=timedelta(seconds=stored["cap"]),
            jitter=stored["jitter"],
        )

    def delay(self, attempt: int) -> timedelta:
        """The wait before the attempt after ``attempt`` (1-based), jitter included."""
        # Cap the exponent first: 2**attempt for a large attempt count is a huge int, and
        # 2**40 seconds is already far beyond any sensible cap.
        exponent = min(max(attempt - 1, 0), 40)
        seconds = min(self.cap.total_seconds(), self.base.total_seconds() * 2**exponent)
        if self.jitter:
            seconds *= random.uniform(1 - self.jitter, 1 + self.jitter)
        return timedelta(seconds=min(seconds, self.cap.total_seconds()))


def check_backoff(backoff: object) -> Backoff | None:
    """None (the task's policy), or a :class:`Backoff`; the same rule at ``@task`` and enqueue."""
    if backoff is not None and not isinstance(backoff, Backoff):
        raise InvalidJobError(
            f"backoff must be a Backoff (e.g. Backoff(base=timedelta(seconds=1))),"
            f" not {value_text(backoff)}"
        )
    return backoff


#: The policy a failure falls back on when its own cannot give a delay. Settling a failure
#: must record the handler's error whatever goes wrong in working out the retry: otherwise
#: the job stays running until its lease expires and the error is lost.
FALLBACK_BACKOFF: Final = Backoff()

#: The retry policy of a job whose task this worker does not know (and that has no policy of
#: its own from enqueue). Most likely a rolling deploy: newer code enqueued it and an older
#: worker claimed it. The attempt counts as a failure, and the job comes back after 30 s,
#: 1 min, 2 min, 4 min, ... (at most 10 min apart), until a worker that knows the task runs it
#: or its ``max_attempts`` run out: with the default 5 attempts, about 7.5 minutes.
UNKNOWN_TASK_BACKOFF: Final = Backoff(base=timedelta(seconds=30), cap=timedelta(minutes=10))


def policy_of(job_id: int, stored: dict[str, Any] | None, default: Backoff) -> Backoff:
    """The retry policy of job ``job_id``: the one enqueue stored with it (``stored``, the
    row's ``backoff``), else ``default`` (its task's, or :data:`UNKNOWN_TASK_BACKOFF`).

    A stored policy this version cannot read (written by hand, or by another version) gives
    way to ``default``, with a warning, rather than fail the settling of the attempt.
    """
    if stored is None:
        return default
    try:
        return Backoff.from_json(stored)
    except Exception as exc:  # any malformed JSON: KeyError, TypeError, TaskDefinitionError
        log.warning("job %d: its stored retry policy cannot be read (%s); using %s",
                    job_id, exc, "its task's" if default is not UNKNOWN_TASK_BACKOFF
                    else "the one for unknown tasks")  # fmt: skip
        return default


def retry_delay(backoff: Backoff, attempt: int) -> timedelta:
    """The wait before the attempt after ``attempt``: ``backoff.delay(attempt)``, or the
    default policy's when that raises or gives no duration of zero or more (a bug in a
    Backoff subclass), so the failure it belongs to is recorded all the same."""
    try:
        delay = backoff.delay(attempt)
        if isinstance(delay, timedelta) and delay >= timedelta(0):
            return delay
        problem = f"it gave {type(delay).__name__} {delay}"
    except Exception as exc:
        problem = f"it raised {type(exc).__name__}: {exc}"
    log.error("the retry policy failed to give a delay (%s); using the default policy's", problem)
    return FALLBACK_BACKOFF.delay(attempt)
