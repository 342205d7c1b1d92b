"""What the batched completion costs: the statement that waits for row locks beside the one
that skips them.

    bench/.venv/bin/python bench/complete_cost.py [--jobs N] [--batches 20,100]

Uses $DATABASE_URL's server (a database ``bench_complete_cost`` is created and dropped). It
enqueues ``--jobs`` no-op jobs, then, on one autocommit connection with nothing else running,
claims them in batches of each size and completes each batch with one statement, the two
statements in turn (``transitions.complete_many``, which waits for a row another transaction
holds locked, and ``transitions.complete_many_unless_locked``, which locks its rows ``SKIP
LOCKED`` first). Each line is the wall time per job of its statement, round trip included,
the median over the rounds.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if sys.path and Path(sys.path[0]).resolve() == ROOT / "bench":
    sys.path[0] = str(ROOT)

import sqlalchemy as sa  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from bench import harness  # noqa: E402
from sa_jobqueue import JobContext, JobQueue  # noqa: E402
from sa_jobqueue._sql import claiming, transitions  # noqa: E402
from sa_jobqueue._sql.fence import held_many  # noqa: E402
from sa_jobqueue.database import create_engine  # noqa: E402
from sa_jobqueue.migrations import upgrade  # noqa: E402

queue = JobQueue()


@queue.task()
def noop(ctx: JobContext, payload: object) -> None:
    pass


STATEMENTS = {
    "waits for locks (complete_many)": transitions.complete_many,
    "skips locked rows (complete_many_unless_locked)": transitions.complete_many_unless_locked,
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=40_000, help="jobs per batch size (default 40000)")
    p.add_argument("--batches", default="20,100", help="batch sizes (default 20,100)")
    args = p.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    print(f"Command: {' '.join(['bench/complete_cost.py', *sys.argv[1:]])}  (commit {commit})")
    with harness.scratch_database("bench_complete_cost") as dsn:
        engine = create_engine(dsn)
        upgrade(engine)
        for size in [int(b) for b in args.batches.split(",")]:
            with engine.begin() as conn:
                conn.execute(sa.text("TRUNCATE sa_jobqueue_jobs"))
            with Session(engine) as session, session.begin():
                queue.enqueue_many(session, "noop", [{} for _ in range(args.jobs)])
            with engine.connect() as conn:
                conn.execute(sa.text("ANALYZE sa_jobqueue_jobs"))
                conn.commit()
                conn = conn.execution_options(isolation_level="AUTOCOMMIT")
                per_job: dict[str, list[float]] = {name: [] for name in STATEMENTS}
                claim = {"from_queue": "default", "limit": size, "worker": "bench"}
                for i in range(args.jobs // size):
                    rows = conn.execute(claiming.claim(), claim).all()
                    pairs = [(row.id, row.attempts) for row in rows]
                    name = list(STATEMENTS)[i % len(STATEMENTS)]
                    params = {**held_many(pairs), "results": "{}"}
                    started = time.perf_counter()
                    conn.execute(STATEMENTS[name](), params).all()
                    per_job[name].append((time.perf_counter() - started) / len(pairs) * 1e6)
            for name, values in per_job.items():
                print(f"batch of {size:>4}: {name:<48} {statistics.median(values):6.1f} us/job")
        engine.dispose()


if __name__ == "__main__":
    main()
