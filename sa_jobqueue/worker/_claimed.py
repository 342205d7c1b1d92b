"""A claimed attempt, as the claim returned it, and the retry policy it runs under."""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from functools import cache
from typing import TYPE_CHECKING, Any, Final

from ..models import CLAIM_ORDER
from ..observability import JobRun
from ..tasks import Backoff, JobContext, Task

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession
    from sqlalchemy.orm import Session

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


@dataclass(frozen=True)
class Claimed:
    """One claimed attempt: the columns of the claim's row named as its fields.

    Read by label (:meth:`of`, :meth:`of_rows`): a claim's row has more columns than these
    (the limited claim's own, what settling the jobs it ended returned), in any order.
    """

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
    #: The limited claim, always from the head, returns no ``visible_at`` (None).
    priority: int = 0
    visible_at: datetime | None = None
    #: When the job was enqueued (database clock; None only in a Claimed made by hand).
    created_at: datetime | None = None
    #: Claimed from a queue with a cap: its completion frees a slot, so it is sent at once.
    #: Not a column: the limited claim's caller sets it.
    holds_slot: bool = False

    @classmethod
    def of(cls, row: Any) -> Claimed:
        """The attempt a claim's row names (a SQLAlchemy ``Row``, or any named tuple), its
        columns read by label."""
        return cls(*_reader(row._fields)(row))

    @classmethod
    def of_rows(cls, rows: Sequence[Any]) -> list[Claimed]:
        """:meth:`of` for each of one result's rows, its labels looked up once for all."""
        if not rows:
            return []
        read = _reader(rows[0]._fields)
        return [cls(*read(row)) for row in rows]

    def context(
        self,
        session: Session | Callable[[], Session],
        async_session: AsyncSession | Callable[[], AsyncSession] | None = None,
    ) -> JobContext:
        """The handler's context for this attempt: the row's fields, and the session given
        (a factory, so that a handler that never asks for one costs none)."""
        return JobContext(
            job_id=self.id,
            task=self.task,
            queue=self.queue,
            attempt=self.attempts,
            max_attempts=self.max_attempts,
            created_at=self.created_at,
            priority=self.priority,
            session=session,
            async_session=async_session,
        )

    def position(self) -> tuple[Any, ...]:
        """The job's place in its queue's claim order, as before the claim: its values of the
        columns :data:`~sa_jobqueue.models.CLAIM_ORDER` names, in that order."""
        return tuple(getattr(self, name) for name in CLAIM_ORDER)

    def run(self) -> JobRun:
        """What observers are told about this attempt."""
        return JobRun(
            self.id, self.task, self.queue, self.attempts, self.max_attempts, self.trace_context
        )


#: The fields of a :class:`Claimed` a claim's row gives, each a column of that label.
ROW_FIELDS: Final = tuple(field.name for field in fields(Claimed) if field.name != "holds_slot")


@cache
def _reader(labels: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """Takes :data:`ROW_FIELDS` out of a row whose columns are ``labels``, in that order.

    The labels are looked up once per shape of row (a statement has one), not once per row:
    reading a SQLAlchemy ``Row`` by attribute costs several times its reading by index, and
    the claim is the worker's hot path.
    """
    missing = [name for name in ROW_FIELDS if name not in labels]
    if missing:
        raise KeyError(f"a claim's row has no column {', '.join(missing)}: {labels}")
    return operator.itemgetter(*(labels.index(name) for name in ROW_FIELDS))


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
