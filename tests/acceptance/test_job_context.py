"""The job's row on its handler's JobContext: what the claim returned, with no query of its own.

Each claim statement returns the row (the plain claim, and the limited claim with and without
limits per key, whose UPDATE is built alike but matches its rows another way): a real drain
runs the job from each kind of queue, and the handler's ``ctx`` must hold the row's values.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from sa_jobqueue import JobContext, JobQueue
from sa_jobqueue.models import jobs_table
from sa_jobqueue.ops import set_queue_concurrency, set_queue_key_concurrency
from sa_jobqueue.testing import drain

#: A created_at far from now, with microseconds, so that "now" cannot pass for it.
CREATED = datetime(2024, 2, 29, 23, 59, 58, 123456, tzinfo=UTC)


def limit(session: Session, queue: str, kind: str) -> None:
    if kind == "capped":
        set_queue_concurrency(session, queue, 2)
    elif kind == "keyed":
        set_queue_key_concurrency(session, queue, 1, key="customer")


@pytest.mark.parametrize("kind", ["plain", "capped", "keyed"])
def test_the_handler_sees_the_rows_created_at_and_priority(engine: sa.Engine, kind: str) -> None:
    queue = JobQueue()
    seen: dict[str, Any] = {}

    @queue.task(queue="q")
    def look(ctx: JobContext, payload: dict[str, str]) -> None:
        seen.update(job_id=ctx.job_id, created_at=ctx.created_at, priority=ctx.priority)

    with Session(engine) as session, session.begin():
        limit(session, "q", kind)
        job_id = queue.enqueue(session, look, {"customer": "c1"}, priority=7)
        # Enqueued long ago: what the handler sees must be the row's, not the time it ran.
        session.execute(
            sa.update(jobs_table).where(jobs_table.c.id == job_id).values(created_at=CREATED)
        )

    assert drain(queue, engine).succeeded == 1

    with engine.connect() as conn:
        row = conn.execute(
            sa.select(jobs_table.c.created_at, jobs_table.c.priority).where(
                jobs_table.c.id == job_id
            )
        ).one()
    assert seen == {"job_id": job_id, "created_at": row.created_at, "priority": 7}
    assert seen["created_at"] == CREATED
    assert seen["created_at"].utcoffset() is not None  # aware, from the database
