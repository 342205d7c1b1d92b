"""A claimed attempt, as the claim returned it."""

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
from ..tasks import JobContext

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession
    from sqlalchemy.orm import Session

log = logging.getLogger("sa_jobqueue.worker")


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
    #: The limited claim returns them too, though it always claims from the head.
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
