"""A real worker serving thousands of queues: named in a file, or by a pattern.

Each queue holds one job: what a worker of one claim per queue drained several times slower
than the same jobs in one queue, at one statement per queue per poll when idle. Here one
worker drains them all, leaves alone what it does not serve and what is paused, and records
what it serves (the pattern, not the queues it matched) in its registry row.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from sa_jobqueue.models import jobs_table, workers_table
from sa_jobqueue.ops import pause_queue
from tests.helpers.processes import WorkerApp, Workers

pytestmark = pytest.mark.slow

WORKER_APP = WorkerApp("tests.apps.many_queues:queue", log_level="INFO")

j = jobs_table.c


def add_jobs(engine: sa.Engine, names: list[str]) -> None:
    """One queued job of ``touch`` in each of ``names`` (one INSERT, like a backlog)."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO sa_jobqueue_jobs (queue, task, payload)"
                " SELECT name, 'touch', 'null' FROM unnest(CAST(:names AS text[])) AS name"
            ),
            {"names": names},
        )


def statuses(engine: sa.Engine) -> dict[str, str]:
    with engine.connect() as conn:
        return {queue: status for queue, status in conn.execute(sa.select(j.queue, j.status))}


def succeeded(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        done = sa.select(sa.func.count()).where(j.status == "succeeded")
        return int(conn.execute(done).scalar_one())


def registered(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(sa.select(workers_table.c.queues)).scalar_one())


def test_a_worker_drains_thousands_of_queues_listed_in_a_file(
    engine: sa.Engine, workers: Workers, tmp_path: Path
) -> None:
    names = [f"tenant-{n:05d}" for n in range(2000)]
    add_jobs(engine, [*names, "tenant-paused", "elsewhere"])
    with engine.begin() as conn:
        pause_queue(conn, "tenant-paused")
    listed = tmp_path / "queues.txt"
    listed.write_text("# every tenant\n" + "\n".join([*names, "tenant-paused"]) + "\n")
    proc = workers.start("--queues-file", str(listed), concurrency=8)
    workers.wait(lambda: succeeded(engine) == len(names), timeout=90)
    left = {queue: status for queue, status in statuses(engine).items() if status != "succeeded"}
    assert left == {"tenant-paused": "queued", "elsewhere": "queued"}
    assert len(registered(engine)) == len(names) + 1
    workers.terminate_all()
    # 2,000 queues no task declares: one warning line, not one per queue.
    log = workers.output(proc)
    assert log.count("no registered task declares") == 1, log


def test_a_pattern_serves_every_queue_it_matches_without_listing_them(
    engine: sa.Engine, workers: Workers
) -> None:
    names = [f"tenant-{n:05d}" for n in range(1000)]
    add_jobs(engine, [*names, "other-1"])
    workers.start("--queues", "tenant-*", concurrency=8)
    workers.wait(lambda: succeeded(engine) == len(names), timeout=90)
    assert statuses(engine)["other-1"] == "queued"
    assert registered(engine) == ["tenant-*"]
    workers.terminate_all()
