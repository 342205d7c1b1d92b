"""Periodic jobs with three real worker processes: each tick is enqueued by exactly one.

Workers call :func:`sa_jobqueue.periodic.enqueue_due` about once a second. A tick is made due
again with :func:`tests.helpers.periodic.rewind` rather than waited for: the yearly schedule
of :mod:`tests.apps.periodic` never ticks by itself during a test, so every job of its task
comes from one rewind, and must come exactly once.
"""

from __future__ import annotations

import functools
import time

import pytest
import sqlalchemy as sa

from tests.helpers.jobs import statuses
from tests.helpers.periodic import last_tick, periodic_jobs, rewind
from tests.helpers.processes import WorkerApp, Workers

pytestmark = pytest.mark.slow


WORKER_APP = WorkerApp("tests.apps.periodic:queue", log_level="WARNING")


def test_three_workers_enqueue_each_rewound_tick_once(engine: sa.Engine, workers: Workers) -> None:
    for _ in range(3):
        workers.start(poll=0.2)
    workers.wait(lambda: last_tick(engine, "yearly"), timeout=30)

    def jobs_at_least(n: int) -> bool:
        return len(periodic_jobs(engine, "yearly_task")) >= n

    rounds = 5
    for n in range(1, rounds + 1):
        rewind(engine, "yearly")
        workers.wait(functools.partial(jobs_at_least, n), timeout=30)
    # A duplicate would come from another worker's next call, within a poll or two: watch for
    # ten poll intervals, and let the workers run what they enqueued.
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        assert len(periodic_jobs(engine, "yearly_task")) == rounds, workers.all_output()
        time.sleep(0.05)
    ticks = [tick for _, tick in periodic_jobs(engine, "yearly_task")]
    assert len(set(ticks)) == 1  # the same latest tick, made due five times
    workers.wait(lambda: statuses(engine).get("succeeded", 0) >= rounds, timeout=30)
    workers.terminate_all()
