"""Named queues: a concurrency per queue, no starvation between queues, and priorities."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.orm import Session

from sa_jobqueue import JobContext, JobQueue, Worker
from tests.helpers.jobs import statuses
from tests.helpers.waiting import running, wait_for


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
        wait_for(lambda: statuses(db, queue="urgent") == {"succeeded": 5})
        assert statuses(db, queue="busy").get("succeeded", 0) == 0
        release.set()
        wait_for(lambda: statuses(db, queue="busy") == {"succeeded": 20})

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
