"""Prometheus metrics: the worker's counters and run times, queue gauges read at scrape time."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from datetime import timedelta

import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sa_jobqueue import Worker
from sa_jobqueue.database import create_engine
from sa_jobqueue.observability import JobRun
from sa_jobqueue.observability.metrics import (
    MetricsServer,
    start_metrics_server,
)
from sa_jobqueue.ops import (
    clear_queue_limits,
    pause_queue,
    set_queue_concurrency,
    set_queue_key_concurrency,
    set_queue_key_rate,
    set_queue_rate,
)
from tests.apps.observed import queue
from tests.helpers.databases import url_string
from tests.helpers.poolers import free_port
from tests.helpers.processes import REPO_ROOT, subprocess_env
from tests.helpers.waiting import running, wait_for

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> Samples:
    """Every sample of ``/metrics``, by name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def status(engine: sa.Engine, job_id: int) -> str | None:
    with engine.connect() as conn:
        job = queue.get_job(conn, job_id)
    return None if job is None else job.status


@pytest.fixture
def server(engine: sa.Engine) -> Iterator[MetricsServer]:
    started = start_metrics_server(
        0, engine, addr="127.0.0.1", queues=["default", "idle"], stats_interval=timedelta(0)
    )
    yield started
    started.close()


def test_a_scrape_shows_what_the_worker_did_and_what_the_queue_holds(
    engine: sa.Engine, server: MetricsServer
) -> None:
    with Session(engine) as session:
        queue.enqueue_many(session, "ok", [1, 2, 3])
        bad = queue.enqueue(session, "fails")
        queue.enqueue_many(session, "ok", [4, 5], run_at=timedelta(hours=1))  # not due yet
        queue.enqueue(session, "ok", queue="other", run_at=timedelta(hours=1))
        session.commit()
    worker = Worker(
        queue,
        engine,
        concurrency=2,
        queues=["default"],
        poll_interval=timedelta(seconds=0.05),
        retention=None,
        observers=[server.observer],
    )
    with running(worker):
        wait_for(lambda: status(engine, bad) == "dead")
        wait_for(
            lambda: value(
                scrape(server.port),
                "sa_jobqueue_jobs_finished_total",
                queue="default",
                task="fails",
                outcome="dead",
            )
        )
    with Session(engine) as session:  # due, and no worker left to take it
        queue.enqueue(session, "ok")
        session.commit()

    samples = scrape(server.port)
    ok = {"queue": "default", "task": "ok"}
    fails = {"queue": "default", "task": "fails"}
    assert value(samples, "sa_jobqueue_jobs_started_total", **ok) == 3
    assert value(samples, "sa_jobqueue_jobs_started_total", **fails) == 2
    finished = "sa_jobqueue_jobs_finished_total"
    assert value(samples, finished, **ok, outcome="succeeded") == 3
    assert value(samples, finished, **ok, outcome="dead") == 0  # present from the start
    assert value(samples, finished, **fails, outcome="retried") == 1
    assert value(samples, finished, **fails, outcome="dead") == 1
    assert value(samples, "sa_jobqueue_job_run_seconds_count", **ok) == 3
    assert value(samples, "sa_jobqueue_job_run_seconds_bucket", **ok, le="600.0") == 3
    assert value(samples, "sa_jobqueue_job_run_seconds_bucket", **ok, le="+Inf") == 3
    assert value(samples, "sa_jobqueue_lease_losses_total", **ok) == 0

    jobs = "sa_jobqueue_queue_jobs"
    assert value(samples, jobs, queue="default", status="queued") == 3  # 2 later, 1 due
    assert value(samples, jobs, queue="default", status="running") == 0
    assert value(samples, "sa_jobqueue_queue_due_jobs", queue="default") == 1
    age = value(samples, "sa_jobqueue_queue_oldest_due_age_seconds", queue="default")
    assert age is not None
    assert 0 <= age < 60
    # A queue no worker serves, and a served queue without jobs.
    assert value(samples, jobs, queue="other", status="queued") == 1
    assert value(samples, "sa_jobqueue_queue_due_jobs", queue="other") == 0
    assert value(samples, jobs, queue="idle", status="queued") == 0
    assert value(samples, "sa_jobqueue_queue_oldest_due_age_seconds", queue="idle") == 0
    assert value(samples, "sa_jobqueue_scrape_errors_total") == 0
    assert value(samples, "process_cpu_seconds_total") is not None  # the process collector


def test_a_failing_database_costs_the_queue_gauges_only(database_url: URL) -> None:
    # Nothing listens on port 1: every scrape's query fails at once.
    down = create_engine(database_url.set(port=1), pool_size=1, max_overflow=0)
    server = start_metrics_server(0, down, addr="127.0.0.1", stats_interval=timedelta(0))
    try:
        server.observer.started(JobRun(1, "ok", "default", 1, 5))
        for expected in (1, 2):
            samples = scrape(server.port)
            assert value(samples, "sa_jobqueue_scrape_errors_total") == expected
            assert not any(name.startswith("sa_jobqueue_queue_") for name, _ in samples)
            started = "sa_jobqueue_jobs_started_total"
            assert value(samples, started, queue="default", task="ok") == 1
    finally:
        server.close()
        down.dispose()


def test_a_locked_table_cannot_hang_a_scrape(engine: sa.Engine, database_url: URL) -> None:
    server = start_metrics_server(
        0,
        engine,
        addr="127.0.0.1",
        queues=["default"],
        stats_timeout=timedelta(seconds=0.2),
        stats_interval=timedelta(0),
    )
    try:
        with engine.connect() as locker:
            locker.exec_driver_sql("LOCK TABLE sa_jobqueue_jobs IN ACCESS EXCLUSIVE MODE")
            samples = scrape(server.port)  # urlopen's timeout is 10 s; the query gives up first
            assert value(samples, "sa_jobqueue_scrape_errors_total") == 1
            locker.rollback()
        samples = scrape(server.port)
        assert value(samples, "sa_jobqueue_queue_due_jobs", queue="default") == 0
        assert value(samples, "sa_jobqueue_scrape_errors_total") == 1
    finally:
        server.close()


def test_queue_figures_are_reused_within_the_interval(engine: sa.Engine) -> None:
    server = start_metrics_server(0, engine, addr="127.0.0.1", queues=["default"])
    try:
        assert value(scrape(server.port), "sa_jobqueue_queue_due_jobs", queue="default") == 0
        with Session(engine) as session:
            queue.enqueue(session, "ok")
            session.commit()
        # Within the default 5 s the figures of the last query are served again.
        assert value(scrape(server.port), "sa_jobqueue_queue_due_jobs", queue="default") == 0
    finally:
        server.close()


def test_a_paused_queue_is_one_in_the_paused_gauge(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        pause_queue(conn, "reports")  # paused before it has jobs, and no worker serves it
    server = start_metrics_server(0, engine, addr="127.0.0.1", queues=["default"])
    try:
        samples = scrape(server.port)
        assert value(samples, "sa_jobqueue_queue_paused", queue="reports") == 1
        assert value(samples, "sa_jobqueue_queue_paused", queue="default") == 0
    finally:
        server.close()


def test_limits_are_gauges_of_the_limited_queues_only(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        set_queue_concurrency(conn, "reports", 3)  # no jobs yet, and no worker serves it
        set_queue_rate(conn, "reports", "50/m")
        set_queue_rate(conn, "emails", "10/s")
        set_queue_key_concurrency(conn, "api", 2, key="customer")
        set_queue_key_rate(conn, "api", "30/m", key="customer")
    server = start_metrics_server(
        0, engine, addr="127.0.0.1", queues=["default"], stats_interval=timedelta(0)
    )
    try:
        samples = scrape(server.port)
        cap, rate = "sa_jobqueue_queue_concurrency_limit", "sa_jobqueue_queue_rate_limit"
        assert value(samples, cap, queue="reports") == 3
        assert value(samples, rate, queue="reports") == pytest.approx(50 / 60)  # per second
        assert value(samples, rate, queue="emails") == 10
        # No series for a limit a queue does not have: 0 would read as "none may run".
        assert value(samples, cap, queue="emails") is None
        assert value(samples, cap, queue="default") is None
        assert value(samples, rate, queue="default") is None
        key_cap, key_rate = (
            "sa_jobqueue_queue_key_concurrency_limit",
            "sa_jobqueue_queue_key_rate_limit",
        )
        assert value(samples, key_cap, queue="api") == 2
        assert value(samples, key_rate, queue="api") == pytest.approx(0.5)
        assert value(samples, key_cap, queue="reports") is None
        assert value(samples, cap, queue="api") is None

        with engine.begin() as conn:
            clear_queue_limits(conn, "reports")
        samples = scrape(server.port)
        assert value(samples, cap, queue="reports") is None
        assert value(samples, rate, queue="reports") is None
        assert value(samples, rate, queue="emails") == 10
    finally:
        server.close()


@pytest.mark.slow
def test_the_cli_worker_serves_metrics(engine: sa.Engine, database_url: URL) -> None:
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sa_jobqueue",
            "worker",
            "tests.apps.observed:queue",
            "--database-url",
            url_string(database_url),
            "--metrics-port",
            str(port),
            "--metrics-address",
            "127.0.0.1",
        ],
        cwd=REPO_ROOT,
        env=subprocess_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    stderr: list[str] = []
    reader = threading.Thread(target=lambda: stderr.extend(process.stderr or []), daemon=True)
    reader.start()
    try:
        with Session(engine) as session:
            queue.enqueue(session, "ok")
            session.commit()

        def succeeded() -> float | None:
            try:
                samples = scrape(port)
            except OSError:
                return None  # not listening yet
            labels = {"queue": "default", "task": "ok", "outcome": "succeeded"}
            return value(samples, "sa_jobqueue_jobs_finished_total", **labels)

        assert wait_for(succeeded, timeout=30) == 1
        # Read from the database at most every 5 s: it may still count the job as due.
        assert value(scrape(port), "sa_jobqueue_queue_due_jobs", queue="default") is not None
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(30)
        reader.join(10)
        if process.stderr is not None:
            process.stderr.close()
    assert code == 0, "".join(stderr)
