"""What progress costs the claim, the completion and the lease renewal, in time and in WAL.

    bench/.venv/bin/python bench/progress_cost.py [--jobs N] [--rounds R]

Uses $DATABASE_URL's server (a database ``bench_progress_cost`` is created and dropped). Each
round, on one autocommit connection with nothing else running: ``--jobs`` jobs are enqueued,
claimed 20 at a time with the worker's claim statement and completed with its batched
completion (``transitions.complete_many``): ``claim+complete``. Then as many again are claimed
and their leases renewed in batches of 20 by the heartbeat's statement
(``leases.extend_leases``) ten times over: ``renew`` without any report, and, where the code
has progress, ``renew+report`` with a report (a fraction and a 16-character message) for every
job at every renewal. Each line gives, per job (per renewed job for the renewals), the wall
time and the WAL the statements themselves wrote, as ``EXPLAIN (ANALYZE, WAL)`` counts it for
each one (so neither the machine's load nor other sessions on the server change it): its
records, its bytes, and its full-page images (a page's first change after a checkpoint
writes the whole page, so the bytes depend on when checkpoints fall; the records do not),
medians over the rounds.

Run it at a commit before progress (with this file copied in) for the ``before`` figures: it
then measures what that code has, the claim, the completion and the plain renewal.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if sys.path and Path(sys.path[0]).resolve() == ROOT / "bench":
    sys.path[0] = str(ROOT)

import sqlalchemy as sa  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from bench import harness  # noqa: E402
from sa_jobqueue import JobContext, JobQueue  # noqa: E402
from sa_jobqueue._sql import claiming, leases, transitions  # noqa: E402
from sa_jobqueue._sql.fence import held_many  # noqa: E402
from sa_jobqueue.database import create_engine  # noqa: E402
from sa_jobqueue.migrations import upgrade  # noqa: E402

queue = JobQueue()


@queue.task()
def noop(ctx: JobContext, payload: object) -> None:
    pass


BATCH = 20
RENEWALS = 10
#: Whether the code measured writes progress with its renewals (False before it did).
HAS_PROGRESS = "progress" in leases.extend_leases().compile().params


class Wal:
    """WAL written by the statements run through :meth:`run` (as EXPLAIN ANALYZE counts it)."""

    def __init__(self) -> None:
        self.bytes = 0
        self.fpi = 0
        self.records = 0

    def run(self, conn: sa.Connection, statement: Any, params: dict[str, Any]) -> None:
        compiled = statement.compile(dialect=conn.dialect)
        text = "EXPLAIN (ANALYZE, WAL, FORMAT JSON) " + compiled.string
        plan = conn.exec_driver_sql(text, compiled.construct_params(params)).scalar_one()[0]
        self.bytes += int(plan["Plan"].get("WAL Bytes", 0))
        self.fpi += int(plan["Plan"].get("WAL FPI", 0))
        self.records += int(plan["Plan"].get("WAL Records", 0))


def running(conn: sa.Connection) -> list[tuple[int, int]]:
    rows = conn.execute(
        sa.text("SELECT id, attempts FROM sa_jobqueue_jobs WHERE status = 'running' ORDER BY id")
    )
    return [(row.id, row.attempts) for row in rows]


def fill(engine: sa.Engine, conn: sa.Connection, jobs: int) -> None:
    conn.execute(sa.text("TRUNCATE sa_jobqueue_jobs"))
    with Session(engine) as session, session.begin():
        queue.enqueue_many(session, "noop", [{"n": n} for n in range(jobs)])
    conn.execute(sa.text("VACUUM ANALYZE sa_jobqueue_jobs"))


def claim_batches(conn: sa.Connection) -> list[list[tuple[int, int]]]:
    claim = {"from_queue": "default", "limit": BATCH, "worker": "bench"}
    batches = []
    while rows := conn.execute(claiming.claim(), claim).all():
        batches.append([(row.id, row.attempts) for row in rows])
    return batches


def renew(
    conn: sa.Connection, batches: list[list[tuple[int, int]]], report: bool
) -> dict[str, float]:
    """Per renewed job: RENEWALS renewals of every batch."""
    wal = Wal()
    began = time.perf_counter()
    for turn in range(RENEWALS):
        for pairs in batches:
            params: dict[str, Any] = held_many(pairs)
            if HAS_PROGRESS:
                message = f"step {turn:>3} of 10"  # 16 characters
                reports = {
                    str(i): {"fraction": turn / RENEWALS, "message": message} for i, _ in pairs
                }
                params["progress"] = json.dumps(reports if report else {})
            wal.run(conn, leases.extend_leases(), params)
    renewed = RENEWALS * sum(len(pairs) for pairs in batches)
    return per_job(wal, time.perf_counter() - began, renewed)


def per_job(wal: Wal, elapsed: float, jobs: int) -> dict[str, float]:
    return {
        "us": elapsed / jobs * 1e6,
        "WAL B": wal.bytes / jobs,
        "WAL records": wal.records / jobs,
        "FPI": wal.fpi / jobs,
    }


def one_round(engine: sa.Engine, jobs: int) -> dict[str, float]:
    measured: dict[str, float] = {}
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        fill(engine, conn, jobs)
        wal = Wal()
        began = time.perf_counter()
        claim = {"from_queue": "default", "limit": BATCH, "worker": "bench"}
        done = 0
        while True:
            wal.run(conn, claiming.claim(), claim)
            pairs = running(conn)
            if not pairs:
                break
            wal.run(conn, transitions.complete_many(), {**held_many(pairs), "results": "{}"})
            done += len(pairs)
        assert done == jobs, done
        for key, value in per_job(wal, time.perf_counter() - began, jobs).items():
            measured[f"claim+complete {key}"] = value
        for report in (False, True) if HAS_PROGRESS else (False,):
            fill(engine, conn, jobs)
            batches = claim_batches(conn)
            name = "renew+report" if report else "renew"
            for key, value in renew(conn, batches, report).items():
                measured[f"{name} {key}"] = value
    return measured


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=5_000, help="jobs per round (default 5000)")
    p.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    args = p.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    print(f"Command: {' '.join(['bench/progress_cost.py', *sys.argv[1:]])}  (commit {commit})")
    rounds: list[dict[str, float]] = []
    with harness.scratch_database("bench_progress_cost") as dsn:
        engine = create_engine(dsn)
        upgrade(engine)
        for _ in range(args.rounds):
            rounds.append(one_round(engine, args.jobs))
        engine.dispose()
    print(
        f"{args.jobs:,} jobs a round, claimed {BATCH} at a time, each renewed {RENEWALS} times;"
        f" medians of {args.rounds} rounds; progress in this code: {HAS_PROGRESS}"
    )
    for measure in rounds[0]:
        value = statistics.median(r[measure] for r in rounds)
        print(f"  {measure:<30}{value:>10.1f}")


if __name__ == "__main__":
    main()
