"""Pause and resume against real ``sa-jobqueue worker`` subprocesses, and the wake-up NOTIFY.

The workers run ``tests.apps.acceptance:queue``, whose handlers record every execution in
``acceptance_runs``. Timings are taken from the database's clock: when the resume's transaction
was about to commit (``clock_timestamp()``, its last statement) and when the claim started the
first job (``started_at``, the claim transaction's ``now()``).
"""

from __future__ import annotations

import functools
import os
import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy import func, select

from sa_jobqueue.models import jobs_table
from sa_jobqueue.ops import pause_queue, resume_queue
from tests.apps import acceptance
from tests.apps.acceptance import runs
from tests.helpers import jobs
from tests.helpers.notify import notifications
from tests.helpers.processes import WorkerApp, Workers

pytestmark = pytest.mark.slow

WORKER_APP = WorkerApp("tests.apps.acceptance:queue", log_level="WARNING")
TABLES = acceptance.metadata
j = jobs_table.c
enqueue_many = functools.partial(jobs.enqueue_many, queue=acceptance.queue)

#: The workers' safety-net poll (seconds): far longer than the latency the test allows, so
#: only the resume's NOTIFY can explain a start within it.
POLL = 30.0
#: How long the test watches a paused queue with idle workers (seconds).
PAUSED_WINDOW = 2.0
#: The issue's bound on resume-to-first-start.
FIRST_START = timedelta(milliseconds=100)


def started(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(
            select(func.count()).select_from(jobs_table).where(j.started_at.is_not(None))
        ).scalar_one()


def recorded_runs(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(runs)).scalar_one()


def listeners(engine: sa.Engine) -> int:
    """Sessions of this database that sit idle after a LISTEN: the workers' listeners."""
    with engine.connect() as conn:
        return conn.execute(
            sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND state = 'idle' AND query LIKE 'LISTEN %'"
            )
        ).scalar_one()


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process ``pid`` so far (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_paused_queue_starts_nothing_and_resume_starts_it_at_once(
    tables: sa.Engine, workers: Workers
) -> None:
    engine = tables
    with engine.begin() as conn:
        pause_queue(conn, "default")
    ids = enqueue_many(engine, "effect", [{"n": n} for n in range(1000)])
    procs = [workers.start(concurrency=8, poll=POLL) for _ in range(2)]
    workers.wait_registered(procs)
    workers.wait(lambda: listeners(engine) >= len(procs), timeout=20)

    # Idle workers, 1,000 due jobs, a paused queue: nothing starts, and nobody spins.
    cpu_before = [cpu_seconds(p.pid) for p in procs]
    deadline = time.monotonic() + PAUSED_WINDOW
    while time.monotonic() < deadline:
        assert started(engine) == 0
        time.sleep(0.1)
    cpu_used = [cpu_seconds(p.pid) - before for p, before in zip(procs, cpu_before, strict=True)]
    workers.assert_alive()
    assert started(engine) == 0
    assert recorded_runs(engine) == 0
    # A lane that claimed in a loop would burn most of a core; an idle worker wakes only for
    # its listener's half-second timeouts and its heartbeat.
    assert max(cpu_used) < 0.25 * PAUSED_WINDOW, cpu_used

    with engine.begin() as conn:
        assert resume_queue(conn, "default") is True
        # The last statement before COMMIT: the commit comes later, so the latency measured
        # from here is, if anything, longer than the real one.
        resumed = conn.execute(select(func.clock_timestamp())).scalar_one()
    workers.wait(lambda: started(engine) > 0, timeout=10, interval=0.005)
    with engine.connect() as conn:
        first = conn.execute(select(func.min(j.started_at))).scalar_one()
    assert first - resumed < FIRST_START, first - resumed

    workers.wait(lambda: jobs.statuses(engine, ids) == {"succeeded": 1000}, timeout=120)
    workers.terminate_all()


def test_a_pause_while_workers_run_stops_new_starts(tables: sa.Engine, workers: Workers) -> None:
    engine = tables
    procs = [workers.start(concurrency=4, poll=0.2)]
    workers.wait_registered(procs)
    first = enqueue_many(engine, "effect", [{"n": n} for n in range(20)])
    workers.wait(lambda: jobs.statuses(engine, first) == {"succeeded": 20}, timeout=30)
    with engine.begin() as conn:
        pause_queue(conn, "default")
    later = enqueue_many(engine, "effect", [{"n": n} for n in range(20)])
    # Several polls and the enqueue's NOTIFY later, none of them has started.
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        assert jobs.statuses(engine, later) == {"queued": 20}
        time.sleep(0.1)
    with engine.begin() as conn:
        resume_queue(conn, "default")
    workers.wait(lambda: jobs.statuses(engine, later) == {"succeeded": 20}, timeout=30)
    workers.terminate_all()


def test_resume_wakes_the_queue_at_commit_and_not_on_rollback(
    engine: sa.Engine, listener: psycopg.Connection[Any]
) -> None:
    with engine.begin() as conn:
        pause_queue(conn, "emails")
    assert notifications(listener, engine) == []  # a pause wakes nobody
    with engine.connect() as conn:
        with conn.begin() as tx:
            assert resume_queue(conn, "emails") is True
            tx.rollback()
        assert notifications(listener, engine) == []
        with conn.begin():
            assert resume_queue(conn, "emails") is True
    assert notifications(listener, engine) == ["emails"]
    with engine.begin() as conn:
        assert resume_queue(conn, "emails") is False  # running already: no wake-up
    assert notifications(listener, engine) == []
