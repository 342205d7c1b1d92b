"""A claimed attempt, as the claim returned it, and the retry policy it runs under."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from ..observability import JobRun
from ..tasks import Backoff, Task

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
    """The retry policy of a job: its own, if enqueue gave one, else its task's."""
    return task.backoff if job.backoff is None else Backoff.from_json(job.backoff)
