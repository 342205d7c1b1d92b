"""Tags and meta through a job's life with a real worker: kept on every retry, read by the
handler when it asks, kept when the dead job is requeued and run again."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from sa_jobqueue import JobContext, JobQueue
from sa_jobqueue.testing import drain


def test_a_retried_job_keeps_its_tags_and_meta(engine: sa.Engine) -> None:
    queue = JobQueue()
    seen: list[tuple[int, list[str], dict[str, Any]]] = []

    @queue.task(max_attempts=2, tags=["billing"], meta={"team": "pay"})
    def flaky(ctx: JobContext, payload: Any) -> None:
        seen.append((ctx.attempt, *ctx.tags_and_meta()))
        if ctx.attempt < 3:
            raise RuntimeError(f"attempt {ctx.attempt} fails")

    with Session(engine) as session, session.begin():
        job_id = queue.enqueue(session, flaky, {}, tags=["customer:42"], meta={"request": "r-1"})

    assert drain(queue, engine, with_retries=True).dead == 1
    labels = (["billing", "customer:42"], {"team": "pay", "request": "r-1"})
    assert seen == [(1, *labels), (2, *labels)]

    # Requeued from dead (attempts extended), it runs again with them, and succeeds.
    with Session(engine) as session, session.begin():
        assert queue.requeue(session, job_id)
    assert drain(queue, engine, with_retries=True).succeeded == 1
    assert seen[-1] == (3, *labels)
    with Session(engine) as session:
        job = queue.get_job(session, job_id)
    assert job is not None
    assert (job.status, job.tags, job.meta) == ("succeeded", *labels)
