"""Does a worker's memory stay flat over a long drain? One process, 1,000,000 jobs.

    bench/.venv/bin/python bench/memory.py [--jobs N] [--concurrency C] [--handler noop|write]

Uses $DATABASE_URL's server (a database ``bench_memory`` is created and dropped). Enqueues
the jobs in bulk, starts one ``sa-jobqueue worker`` and samples its resident memory
(/proc/<pid>/status, VmRSS) together with the number of jobs finished so far. Prints the mean
RSS over the first and over the last 10% of the jobs and their ratio: anything kept per job
shows as growth. The ``write`` handler inserts one row through ``ctx.session``, the
exactly-once path (its group transactions, savepoints and sessions); ``noop`` does nothing.
Linux only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if sys.path and Path(sys.path[0]).resolve() == ROOT / "bench":
    sys.path[0] = str(ROOT)

import psycopg  # noqa: E402

from bench import harness  # noqa: E402

TASKS = "bench.memory_tasks:queue"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def finished(conn: psycopg.Connection[tuple[int]]) -> int:
    # The jobs still waiting are counted through the claim index; finished = total - those.
    row = conn.execute(
        "SELECT count(*) FROM sa_jobqueue_jobs WHERE status IN ('queued', 'running')"
    ).fetchone()
    assert row is not None
    return row[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--handler", choices=("noop", "write"), default="noop")
    args = parser.parse_args()
    admin = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    dsn = harness.recreate_database(admin, "bench_memory")
    try:
        from sa_jobqueue.database import create_engine
        from sa_jobqueue.migrations import upgrade

        engine = create_engine(dsn)
        upgrade(engine)
        engine.dispose()
        with psycopg.connect(dsn, autocommit=True) as conn:
            started = time.monotonic()
            conn.execute("CREATE TABLE memory_results (n int PRIMARY KEY)")
            conn.execute(
                "INSERT INTO sa_jobqueue_jobs (queue, task, payload)"
                " SELECT 'memory', %s, jsonb_build_object('n', g)"
                " FROM generate_series(1, %s) AS g",
                (args.handler, args.jobs),
            )
            conn.execute("ANALYZE sa_jobqueue_jobs")
            print(f"enqueued {args.jobs:,} jobs in {time.monotonic() - started:.1f}s")
            worker = subprocess.Popen(
                [sys.executable, "-m", "sa_jobqueue", "--log-level", "WARNING", "worker", TASKS,
                 "--database-url", dsn, "--concurrency", str(args.concurrency), "--burst",
                 "--retention", "forever"],
                cwd=ROOT,
            )  # fmt: skip
            samples: list[tuple[int, float]] = []
            began = time.monotonic()
            while worker.poll() is None:
                try:
                    rss = rss_mib(worker.pid)
                except (OSError, RuntimeError):
                    break
                samples.append((args.jobs - finished(conn), rss))
                time.sleep(0.5)
            elapsed = time.monotonic() - began
            left = finished(conn)
        tenth = args.jobs // 10
        first = [rss for done, rss in samples if done <= tenth and done > 0]
        last = [rss for done, rss in samples if done >= args.jobs - tenth]
        print(f"drained {args.jobs - left:,} jobs in {elapsed:.1f}s ({args.jobs / elapsed:,.0f}/s)")
        if not first or not last:
            print("too few samples to compare")
            return 1
        a, b = statistics.mean(first), statistics.mean(last)
        peak = max(rss for _, rss in samples)
        print(
            f"RSS: first 10% of jobs {a:.1f} MiB, last 10% {b:.1f} MiB, ratio {b / a:.3f};"
            f" peak {peak:.1f} MiB ({len(samples)} samples)"
        )
        return 0 if left == 0 else 1
    finally:
        harness.drop_database(admin, "bench_memory")


if __name__ == "__main__":
    raise SystemExit(main())
