"""Named queues: a concurrency per queue, no starvation between queues, and priorities."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sa_jobqueue import JobContext, JobQueue, Worker
from sa_jobqueue.cli._values import queues as _queues
from sa_jobqueue.cli._worker import lanes as _lanes
from sa_jobqueue.database import create_engine
from sa_jobqueue.models import Job
from tests.support import running, wait_for


@pytest.fixture
def db(database_url: URL) -> Iterator[sa.Engine]:
    engine = create_engine(database_url, pool_size=20)
    yield engine
    engine.dispose()


def statuses(engine: sa.Engine, queue: str) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(Job.status, sa.func.count()).where(Job.queue == queue).group_by(Job.status)
        ).all()
    return {status: n for status, n in rows}


def test_a_busy_queue_cannot_take_another_queues_threads(db: sa.Engine) -> None:
    queue = JobQueue()
    release = threading.Event()
    lock = threading.Lock()
    running_now = {"busy": 0, "urgent": 0}
    most = {"busy": 0, "urgent": 0}

    def body(ctx: JobContext, payload: None) -> None:
        with lock:
            running_now[ctx.queue] += 1
            most[ctx.queue] = max(most[ctx.queue], running_now[ctx.queue])
        if ctx.queue == "busy":
            release.wait(20)
        with lock:
            running_now[ctx.queue] -= 1

    queue.task(name="slow", queue="busy")(body)
    queue.task(name="quick", queue="urgent")(body)
    with Session(db) as session:
        queue.enqueue_many(session, "slow", [None] * 20)
        session.commit()

    worker = Worker(queue, db, queues={"busy": 2, "urgent": 1}, listen=False, prefetch=0)
    assert worker.concurrency == 3
    with running(worker):
        wait_for(lambda: most["busy"] == 2)
        with Session(db) as session:
            queue.enqueue_many(session, "quick", [None] * 5)
            session.commit()
        # All of busy's threads are blocked, yet urgent's jobs run.
        wait_for(lambda: statuses(db, "urgent") == {"succeeded": 5})
        assert statuses(db, "busy").get("succeeded", 0) == 0
        release.set()
        wait_for(lambda: statuses(db, "busy") == {"succeeded": 20})

    assert most == {"busy": 2, "urgent": 1}


def test_lower_priority_number_first_then_run_at_then_id(db: sa.Engine) -> None:
    queue = JobQueue()
    order: list[str] = []

    @queue.task
    def note(ctx: JobContext, name: str) -> None:
        order.append(name)

    past = datetime(2000, 1, 1, tzinfo=UTC)
    with Session(db) as session:
        queue.enqueue(session, note, "late-0", priority=0)
        queue.enqueue(session, note, "urgent", priority=-5)
        queue.enqueue(session, note, "early-0", priority=0, run_at=past)
        queue.enqueue(session, note, "earliest-0", priority=0, run_at=past - timedelta(days=1))
        queue.enqueue(session, note, "background", priority=10, run_at=past - timedelta(days=9))
        queue.enqueue(session, note, "late-0-second", priority=0)
        session.commit()
    Worker(queue, db, concurrency=1, prefetch=0, listen=False).run(burst=True)

    assert order == ["urgent", "earliest-0", "early-0", "late-0", "late-0-second", "background"]


def test_the_cli_reads_a_concurrency_per_queue() -> None:
    assert _lanes(_queues("a,b"), 4) == ["a", "b"]
    assert _lanes(_queues("emails=8,reports=1"), 4) == {"emails": 8, "reports": 1}
    assert _lanes(_queues("emails=8,default"), 4) == {"emails": 8, "default": 4}
    with pytest.raises(Exception, match="at least 1"):
        _queues("emails=0")
