from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session

from sa_jobqueue import JobContext, JobQueue, Worker
from sa_jobqueue.models import Job

queue = JobQueue()
ran: list[int] = []


@queue.task
def record(ctx: JobContext, payload: dict[str, int]) -> None:
    ran.append(payload["n"])


def test_enqueue_and_run(engine: sa.Engine) -> None:
    with Session(engine) as session, session.begin():
        ids = [queue.enqueue(session, "record", {"n": i}) for i in range(5)]
        ids += queue.enqueue_many(session, "record", [{"n": i} for i in range(5, 10)])
    Worker(queue, engine, concurrency=3).run(burst=True)
    assert sorted(ran) == list(range(10))
    with Session(engine) as session:
        rows = session.scalars(sa.select(Job).where(Job.id.in_(ids))).all()
        assert {r.status for r in rows} == {"succeeded"}
        assert {r.attempts for r in rows} == {1}
