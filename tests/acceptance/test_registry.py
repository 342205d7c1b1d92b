"""Each worker process registers itself, refreshes its row, and removes it when it stops."""

from __future__ import annotations

import socket
from datetime import timedelta

import sqlalchemy as sa

from sa_jobqueue import JobContext, JobQueue, Worker
from sa_jobqueue.models import jobs_table, workers_table
from tests.helpers.waiting import running, wait_for

w = workers_table.c
j = jobs_table.c


def rows(engine: sa.Engine) -> dict[str, sa.Row[tuple[str, str, int, list[str], int]]]:
    with engine.connect() as conn:
        found = conn.execute(sa.select(w.name, w.host, w.pid, w.queues, w.concurrency)).all()
    return {row.name: row for row in found}


def test_a_worker_registers_expires_the_dead_and_leaves_when_it_stops(engine: sa.Engine) -> None:
    queue = JobQueue()

    @queue.task(queue="emails")
    def send(ctx: JobContext, payload: None) -> None:
        pass

    with engine.begin() as conn:
        conn.execute(
            sa.insert(workers_table).values(
                name="gone", host="elsewhere", pid=1, queues=["default"], concurrency=1,
                last_seen_at=sa.func.now() - timedelta(minutes=5),
            )
        )  # fmt: skip
    worker = Worker(queue, engine, concurrency=3, listen=False)
    with running(worker):
        registered = wait_for(lambda: rows(engine).get(worker.name))
        wait_for(lambda: "gone" not in rows(engine))
    assert registered.host == socket.gethostname()
    assert registered.queues == ["default", "emails"]
    assert registered.concurrency == 3
    assert rows(engine) == {}


def test_workers_serving_an_undeclared_queue_register_under_their_own_names(
    engine: sa.Engine,
) -> None:
    # A queue no task declares once made the constructor's warning loop overwrite the worker's
    # name with the queue's: two such workers shared one registry row, and jobs named the queue.
    queue = JobQueue()

    @queue.task()
    def touch(ctx: JobContext, payload: int) -> None:
        pass

    with engine.begin() as conn:
        ids = [queue.enqueue(conn, "touch", i, queue="adhoc") for i in range(4)]
    first = Worker(queue, engine, queues=["adhoc"], name="alpha", listen=False,
                   poll_interval=timedelta(milliseconds=50))  # fmt: skip
    second = Worker(queue, engine, queues=["adhoc"], name="beta", listen=False,
                    poll_interval=timedelta(milliseconds=50))  # fmt: skip
    assert (first.name, second.name) == ("alpha", "beta")
    assert Worker(queue, engine, queues=["adhoc"]).name.startswith(f"{socket.gethostname()}:")
    with running(first), running(second):
        registered = wait_for(lambda: (found := rows(engine)).keys() >= {"alpha", "beta"} and found)
        assert set(registered) == {"alpha", "beta"}
        assert registered["alpha"].queues == ["adhoc"] == registered["beta"].queues

        def settled() -> list[str | None]:
            with engine.connect() as conn:
                found = (
                    conn.execute(sa.select(j.worker).where(j.id.in_(ids), j.status == "succeeded"))
                    .scalars()
                    .all()
                )
            return list(found) if len(found) == len(ids) else []

        assert set(wait_for(settled)) <= {"alpha", "beta"}
