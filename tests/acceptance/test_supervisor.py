"""``sa-jobqueue worker --processes N``: the supervisor and its worker processes, for real.

Each test starts the real command in a subprocess: a child SIGKILLed in the middle of a job is
replaced and the job completes once; SIGTERM drains every child and the command exits 0; the
one metrics endpoint adds up the children's counters; children that crash at start end the
command with status 1; and a burst with ``--max-jobs-per-child`` recycles children until the
queue is empty. The workers load ``tests.apps.acceptance:queue``, which records every
execution (with its pid) in ``acceptance_runs``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import urllib.request
from functools import partial
from pathlib import Path

import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

from sa_jobqueue.models import workers_table
from tests.apps import acceptance
from tests.apps.acceptance import effects, runs
from tests.helpers import jobs
from tests.helpers.jobs import job_row, statuses
from tests.helpers.poolers import free_port
from tests.helpers.processes import CLI, REPO_ROOT, WorkerApp, Workers, subprocess_env
from tests.helpers.waiting import wait_for

WORKER_APP = WorkerApp("tests.apps.acceptance:queue", log_level="INFO")
TABLES = acceptance.metadata
enqueue = partial(jobs.enqueue, queue=acceptance.queue)
enqueue_many = partial(jobs.enqueue_many, queue=acceptance.queue)


def run_pids(engine: sa.Engine) -> dict[int, int]:
    """How many executions each process ran, from the audit table."""
    with engine.connect() as conn:
        rows = conn.execute(sa.select(runs.c.pid, sa.func.count()).group_by(runs.c.pid)).all()
    return {pid: n for pid, n in rows}


def effect_count(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(effects)).scalar_one())


def registered(engine: sa.Engine) -> set[int]:
    """The pids in the worker registry (a killed worker's row stays until it goes stale)."""
    with engine.connect() as conn:
        return set(conn.execute(sa.select(workers_table.c.pid)).scalars())


def succeeded_total(port: int) -> float | None:
    """The sum of ``sa_jobqueue_jobs_finished_total{outcome="succeeded"}``, or None."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None  # not listening yet
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "sa_jobqueue_jobs_finished_total"
        and sample.labels.get("outcome") == "succeeded"
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
def test_a_killed_child_is_replaced_and_sigterm_drains_them_all(
    tables: sa.Engine, workers: Workers, tmp_path: Path
) -> None:
    engine = tables
    port = free_port()
    supervisor = workers.start(
        "--processes",
        "2",
        "--metrics-port",
        str(port),
        "--metrics-address",
        "127.0.0.1",
        "--shutdown-grace",
        "10",
        "--prefetch",
        "0",
        concurrency=2,
    )
    # A job whose first attempt hangs: SIGKILL the child running it.
    stalled = enqueue(engine, "stall_first")
    [(victim, _)] = workers.wait(lambda: list(run_pids(engine).items()), timeout=90)
    os.kill(victim, signal.SIGKILL)
    # The supervisor starts a new child; the job's lease (2 s) expires and it runs again, once.
    workers.wait(lambda: job_row(engine, stalled).status == "succeeded", timeout=90)
    row = job_row(engine, stalled)
    assert row.attempts == 2, row
    with engine.connect() as conn:
        assert conn.execute(sa.select(effects.c.job_id)).scalars().all() == [stalled]

    # Two children, the new one among them, share four jobs (two threads each, no prefetch),
    # and the one endpoint counts the successes of them all, the killed child's included.
    workers.wait(lambda: len(registered(engine) - {victim}) == 2, timeout=90)
    gate = tmp_path / "gate"
    ids = enqueue_many(engine, "gated", [{"gate": str(gate)}] * 4)
    workers.wait(lambda: sum(run_pids(engine).values()) == 6, timeout=90)
    gate.touch()
    workers.wait(lambda: statuses(engine, ids) == {"succeeded": 4}, timeout=90)
    assert effect_count(engine) == 5  # one effect per job, none twice
    pids = run_pids(engine)
    children = set(pids) - {victim}
    assert len(children) == 2, pids
    assert sum(pids.values()) == 6  # every job ran once, the stalled one twice
    # Each child leads a session of its own, as a separately started worker would: the
    # kernel's autogroup scheduling then shares the CPU per child, not per supervisor.
    assert {os.getsid(pid) for pid in children} == children
    assert wait_for(lambda: succeeded_total(port) == 5, timeout=10)

    workers.signal(supervisor, signal.SIGTERM)
    assert workers.wait_exit(supervisor, timeout=90) == 0, workers.output(supervisor)
    assert not any(alive(pid) for pid in children)


@pytest.mark.slow
def test_children_that_keep_crashing_end_the_command(tables: sa.Engine, workers: Workers) -> None:
    # Each child imports the app on its own: under a loaded machine that takes seconds.
    result = subprocess.run(
        [*CLI, "worker", "tests.apps.child_crash:queue", "--database-url", workers.url,
         "--processes", "3"],
        cwd=REPO_ROOT, env=subprocess_env(), stdin=subprocess.DEVNULL, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    # Three crashes, restarts after 1 s, and the crash-loop rule (five within a minute).
    assert result.stderr.count("started worker process") >= 5, result.stderr


@pytest.mark.slow
def test_a_burst_recycles_children_until_the_queue_is_empty(
    tables: sa.Engine, workers: Workers
) -> None:
    engine = tables
    ids = enqueue_many(engine, "effect", [None] * 10)
    supervisor = workers.start(
        "--processes", "2", "--burst", "--max-jobs-per-child", "3", "--prefetch", "0",
        concurrency=1,
    )  # fmt: skip
    assert workers.wait_exit(supervisor, timeout=300) == 0, workers.output(supervisor)
    assert statuses(engine, ids) == {"succeeded": 10}
    assert effect_count(engine) == 10
    pids = run_pids(engine)
    assert sum(pids.values()) == 10
    # A child stops once it has finished three jobs; the completion of its third may already
    # have claimed it a fourth, which it runs. So four at most each: three children at least.
    assert max(pids.values()) <= 3 + 1, pids
    assert len(pids) >= 3, pids
