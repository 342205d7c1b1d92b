"""Progress reported by handlers in a real worker subprocess reaches the job's row.

The handlers (tests/apps/progress.py) report, then block on a gate file; the test polls the
row until the progress appears, and only then opens the gate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from sa_jobqueue.models import jobs_table
from tests.apps import progress
from tests.helpers.jobs import enqueue
from tests.helpers.processes import WorkerApp, Workers
from tests.helpers.waiting import wait_for

pytestmark = pytest.mark.slow

WORKER_APP = WorkerApp("tests.apps.progress:queue", log_level="INFO")

j = jobs_table.c


def row(engine: sa.Engine, job_id: int) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            sa.select(
                j.status,
                j.attempts,
                j.visible_at,
                j.progress,
                j.progress_message,
                j.progress_at,
            ).where(j.id == job_id)
        ).one()


def test_a_handlers_latest_progress_reaches_its_row_while_it_runs(
    engine: sa.Engine, workers: Workers, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    job_id = enqueue(engine, "reports", {"gate": str(gate)}, queue=progress.queue)
    workers.start(concurrency=2)
    # The lease is 30 s (renewed every 10 s): a report brings a renewal forward, at most one
    # every 2 s, so a renewal may write a report from the middle of the loop first; the last
    # one is written by the next.
    seen = wait_for(
        lambda: (r := row(engine, job_id)).progress == 0.5 and r,
        timeout=20,
        context=workers.all_output,
    )
    assert seen.status == "running"
    assert seen.progress_message == "step 10000 of 20000"
    assert seen.progress_at is not None
    gate.touch()
    done = wait_for(lambda: (r := row(engine, job_id)).status == "succeeded" and r, timeout=20)
    # The completion writes no progress: the finished row keeps what the last renewal wrote.
    assert (done.progress, done.progress_message) == (0.5, "step 10000 of 20000")
    workers.assert_alive()


def test_a_progress_the_database_refuses_never_fails_the_job(
    engine: sa.Engine, workers: Workers, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    job_id = enqueue(
        engine, "reports_what_the_database_refuses", {"gate": str(gate)}, queue=progress.queue
    )
    workers.start(concurrency=1)
    first = wait_for(lambda: (r := row(engine, job_id)).status == "running" and r, timeout=20)
    # Its 2 s lease renewed past the failed write, more than once: the lease outlives the
    # time it had at the claim by far.
    wait_for(
        lambda: row(engine, job_id).visible_at.timestamp() > first.visible_at.timestamp() + 2.5,
        timeout=20,
        context=workers.all_output,
    )
    gate.touch()
    done = wait_for(lambda: (r := row(engine, job_id)).status == "succeeded" and r, timeout=20)
    assert done.attempts == 1
    assert done.progress is None
    assert "was not written with the failed renewal" in workers.all_output()
    workers.assert_alive()


def test_a_hard_limited_attempts_child_sends_its_progress_to_its_worker(
    engine: sa.Engine, workers: Workers, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    job_id = enqueue(engine, "in_child", {"gate": str(gate)}, queue=progress.queue)
    workers.start(concurrency=1)
    seen = wait_for(
        lambda: (r := row(engine, job_id)).progress is not None and r,
        timeout=30,
        context=workers.all_output,
    )
    assert (seen.progress, seen.progress_message) == (0.3, "from the child")
    gate.touch()
    wait_for(lambda: row(engine, job_id).status == "succeeded", timeout=30)
