"""A worker embedded in an application: Worker.from_url builds what the command builds, and
Worker.arun runs it on an asyncio loop without blocking it, stopping it gracefully when the
awaiting task is cancelled (as an ASGI app's lifespan does at shutdown)."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.error
import urllib.request
from datetime import timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sa_jobqueue import JobContext, JobQueue, Worker
from sa_jobqueue.database import CONTROL_SETTINGS, create_control_engine, pooler_of
from sa_jobqueue.errors import SchemaError, WorkerConfigError
from sa_jobqueue.observability.health import start_health_server
from tests.helpers.jobs import job


def test_from_url_builds_the_engines_the_command_builds(database_url: URL) -> None:
    worker = Worker.from_url(database_url, JobQueue(), queues={"a": 2, "b": 3}, pooler="session")
    like_the_command = create_control_engine(database_url, 5)
    try:
        assert worker.engine.pool.size() == 5  # type: ignore[attr-defined]
        control = worker.control_engine
        assert control.pool.size() == like_the_command.pool.size()  # type: ignore[attr-defined]
        assert control.pool._max_overflow == 5  # type: ignore[attr-defined]
        assert pooler_of(control) == "session"
        with control.connect() as conn:
            assert conn.exec_driver_sql("SHOW lock_timeout").scalar_one() == "5s"
            assert CONTROL_SETTINGS["lock_timeout"] == "5s"
    finally:
        like_the_command.dispose()
        worker.engine.dispose()
        worker.control_engine.dispose()
    with pytest.raises(WorkerConfigError):
        Worker.from_url(database_url, JobQueue(), concurrency=0)


def test_a_worker_from_url_that_cannot_start_leaves_no_connection_open(
    empty_database_url: URL,
) -> None:
    """Its schema check fails (no tables): run() raises, and the engines it owns are disposed
    of, as when it returns, not left to the garbage collector with their connections."""
    worker = Worker.from_url(empty_database_url, JobQueue(), concurrency=1)
    with pytest.raises(SchemaError):
        worker.run(burst=True)
    for engine in (worker.engine, worker.control_engine):
        assert engine.pool.checkedin() == 0  # type: ignore[attr-defined]


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            return answer.status, answer.read().decode().strip()
    except urllib.error.HTTPError as failed:
        return failed.code, failed.read().decode().strip()


def test_arun_runs_on_the_loop_and_a_cancellation_stops_it_gracefully(
    db: sa.Engine, database_url: URL
) -> None:
    queue = JobQueue()
    started = threading.Event()

    @queue.task
    def quick(ctx: JobContext, payload: None) -> str:
        return "quick"

    @queue.task
    def until_stopped(ctx: JobContext, payload: None) -> str:
        started.set()
        deadline = time.monotonic() + 20
        while not ctx.stop_requested:  # a well-behaved handler: it ends when asked to
            assert time.monotonic() < deadline, "the cancellation never reached the handler"
            time.sleep(0.02)
        return "stopped"

    with Session(db) as session, session.begin():
        quick_id = queue.enqueue(session, "quick")

    async def application() -> int:
        worker = Worker.from_url(database_url, queue, concurrency=2, poll_interval=timedelta(0.1))
        probes = start_health_server(0, worker, db, addr="127.0.0.1")
        task = asyncio.create_task(worker.arun())
        turns = 0  # the loop goes on while the worker runs
        deadline = time.monotonic() + 20
        while job(db, quick_id).status != "succeeded":
            assert time.monotonic() < deadline
            turns += 1
            await asyncio.sleep(0.02)
        with Session(db) as session, session.begin():
            slow_id = queue.enqueue(session, "until_stopped")
        while not started.is_set():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        assert _get(probes.port, "/readyz") == (200, "ready")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert worker.stopping
        assert _get(probes.port, "/readyz") == (503, "stopping")
        assert _get(probes.port, "/livez") == (200, "alive")
        probes.close()
        return slow_id if turns > 1 else 0

    slow_id = asyncio.run(application())
    assert slow_id, "the loop did not turn while the worker ran"
    row = job(db, slow_id)
    # Its outcome was written before the cancellation went on.
    assert (row.status, row.attempts) == ("succeeded", 1)
