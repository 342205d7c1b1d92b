"""A workflow cancelled, then retried, while real ``sa-jobqueue worker`` subprocesses run it
and are SIGKILLed mid-run: every step's effect happens exactly once, each after the steps it
needs, and nothing outside the workflow is touched.

The workers run ``tests.apps.workflow_steps:queue``; the cancel and the retry are the CLI's
(``sa-jobqueue workflows cancel|retry ID``), each one transaction. The test synchronises on
job rows polled with a deadline, never on sleeps.
"""

from __future__ import annotations

import signal
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from sa_jobqueue.models import jobs_table
from sa_jobqueue.workflows import Call, Dag, Workflow
from tests.apps import workflow_steps
from tests.apps.workflow_steps import effects
from tests.helpers.processes import WorkerApp, Workers, run_cli

WORKER_APP = WorkerApp("tests.apps.workflow_steps:queue", log_level="INFO")
TABLES = workflow_steps.metadata
j = jobs_table.c
PARTS = 6


#: How long each part runs (ms).
PART_MS = 5000


def statuses(engine: sa.Engine, flow: Workflow) -> dict[str, str]:
    with engine.connect() as conn:
        rows = conn.execute(sa.select(j.workflow_step, j.status).where(j.workflow_id == flow.id))
        return {step: status for step, status in rows}


def count(found: dict[str, str], *wanted: str) -> int:
    return sum(1 for status in found.values() if status in wanted)


def effect_rows(engine: sa.Engine) -> list[Any]:
    with engine.connect() as conn:
        return conn.execute(sa.select(effects).order_by(effects.c.id)).all()


def cli(workers: Workers, *args: str) -> str:
    done = run_cli("workflows", *args, "--database-url", workers.url)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.slow
def test_a_workflow_cancelled_and_retried_mid_run_with_sigkills_runs_each_step_once(
    tables: sa.Engine, workers: Workers
) -> None:
    engine = tables
    dag = Dag().add("fetch", Call("step", {"step": "fetch", "ms": 0}))
    for n in range(PARTS):
        # Long enough to be still running when the cancellation lands: the CLI that sends it
        # is a process of its own, which a loaded machine takes seconds to start.
        dag.add(f"part{n}", Call("step", {"step": f"part{n}", "ms": PART_MS}), needs=["fetch"])
    dag.add(
        "merge", Call("step", {"step": "merge", "ms": 0}), needs=[f"part{n}" for n in range(PARTS)]
    )
    with Session(engine) as session, session.begin():
        flow = workflow_steps.queue.workflow(session, dag)
        bystander = workflow_steps.queue.enqueue(session, "step", {"step": "alone", "ms": 0})

    first = workers.start(concurrency=3)
    workers.wait(lambda: count(statuses(engine, flow), "running") >= 2, timeout=30)
    said = cli(workers, "cancel", str(flow.id))
    assert "cancellation requested of" in said
    # The worker dies with its cancelled jobs still running: nobody ends them but the lease.
    workers.signal(first, signal.SIGKILL)
    workers.wait_exit(first, timeout=10)
    second = workers.start(concurrency=3)
    workers.wait(lambda: count(statuses(engine, flow), "waiting", "queued", "running") == 0, 30)
    cancelled = statuses(engine, flow)
    assert cancelled["fetch"] == "succeeded"
    assert cancelled["merge"] == "cancelled"
    assert count(cancelled, "cancelled") >= 1 + 3  # merge, and the parts that ran or waited

    said = cli(workers, "retry", str(flow.id))
    assert "job(s) back (1 waiting for others)" in said  # merge waits for the parts
    workers.wait(lambda: count(statuses(engine, flow), "running") >= 2, timeout=30)
    workers.signal(second, signal.SIGKILL)  # mid-run again, this time not cancelled
    workers.wait_exit(second, timeout=10)
    workers.start(concurrency=3)
    workers.wait(lambda: set(statuses(engine, flow).values()) == {"succeeded"}, timeout=60)

    rows = effect_rows(engine)
    by_job: dict[int, list[Any]] = {}
    for row in rows:
        by_job.setdefault(row.job_id, []).append(row)
    assert sorted(by_job) == sorted([*flow, bystander])
    assert all(len(done) == 1 for done in by_job.values()), rows  # each step's effect once
    at = {done[0].step: done[0].at for done in by_job.values()}
    assert all(at["fetch"] < at[f"part{n}"] < at["merge"] for n in range(PARTS))
    assert by_job[flow.steps["fetch"]][0].attempt == 1  # a succeeded step never runs again
