"""A claimed attempt, as the claim returned it, and the retry policy it runs under."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from ..observability import JobRun
from ..tasks import Backoff, Task

log = logging.getLogger("sa_jobqueue.worker")

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

#: The columns of a claimed row that make a :class:`Claimed`, in order.
CLAIM_COLUMNS: Final = 12


@dataclass(frozen=True)
class Claimed:
    """One claimed attempt: the columns ``claim()`` returns, in order."""

    id: int
    queue: str
    task: str
    payload: str  # JSON text, decoded per job
    status: str
    attempts: int
    max_attempts: int
    lease: timedelta
    trace_context: dict[str, str] | None
    backoff: dict[str, float] | None  # the job's own retry policy, if enqueue gave one
    #: With ``id``, the job's claim position: its priority and ``visible_at`` as they were
    #: before the claim (where the lane's next claim can start; see ``claiming.claim_after``).
    priority: int = 0
    due_at: datetime | None = None
    #: Claimed from a queue with a cap: its completion frees a slot, so it is sent at once.
    holds_slot: bool = False

    @classmethod
    def of(cls, row: Sequence[Any]) -> Claimed:
        """The attempt a claim's row names: its first :data:`CLAIM_COLUMNS` columns (a claim
        returns more after them, such as what settling the jobs it ended returned)."""
        return cls(*row[:CLAIM_COLUMNS])

    def run(self) -> JobRun:
        """What observers are told about this attempt."""
        return JobRun(
            self.id, self.task, self.queue, self.attempts, self.max_attempts, self.trace_context
        )


def policy(job: Claimed, task: Task) -> Backoff:
    """The retry policy of a job: its own, if enqueue gave one, else its task's.

    A stored policy this version cannot read (written by hand, or by another version) gives
    way to the task's, with a warning, rather than fail the settling of the attempt.
    """
    if job.backoff is None:
        return task.backoff
    try:
        return Backoff.from_json(job.backoff)
    except Exception as exc:  # any malformed JSON: KeyError, TypeError, TaskDefinitionError
        log.warning("job %d: its stored retry policy cannot be read (%s); using its task's",
                    job.id, exc)  # fmt: skip
        return task.backoff


def unknown_task_policy(job: Claimed) -> Backoff:
    """The retry policy of a job whose task this worker does not know: its own, if enqueue
    gave one (and it can be read), else :data:`UNKNOWN_TASK_BACKOFF`."""
    if job.backoff is not None:
        try:
            return Backoff.from_json(job.backoff)
        except Exception:  # unreadable: the default for unknown tasks serves
            pass
    return UNKNOWN_TASK_BACKOFF


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
