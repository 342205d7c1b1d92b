"""A drain by real workers of a queue without a cap and of the same queue capped, alternating.

    bench/.venv/bin/python bench/cap_drain.py [--task noop|write] [--jobs N] [--procs P]
        [--threads T] [--cap C] [--rounds R] [--ms MS]

Uses $DATABASE_URL's server (a database ``bench_cap_drain`` is created and dropped). Each run
enqueues ``--jobs`` jobs of ``bench.tasks:<task>`` (``sleep``: each waits ``--ms``) into queue
``bench`` and drains them with ``--procs`` ``sa-jobqueue worker --burst`` processes of
``--threads`` threads each. Three shapes alternate: the queue without a cap; capped at
``--cap`` (``ops.set_queue_concurrency``); and without a cap but with ``--cap`` threads in all
(the same concurrency the cap allows, reached locally, spread over the processes). The rate is
jobs over the database's span from the first start to the last finish; the workers' CPU per job
is their children's rusage. Prints each run, then the medians and their ratios.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if sys.path and Path(sys.path[0]).resolve() == ROOT / "bench":
    sys.path[0] = str(ROOT)

import psycopg  # noqa: E402

from bench import harness  # noqa: E402
from sa_jobqueue.database import create_engine  # noqa: E402
from sa_jobqueue.migrations import upgrade  # noqa: E402
from sa_jobqueue.ops import set_queue_concurrency  # noqa: E402

DATABASE = "bench_cap_drain"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", choices=("noop", "write", "sleep"), default="noop")
    p.add_argument("--ms", type=int, default=10, help="how long each sleep job waits")
    p.add_argument("--jobs", type=int, default=5000)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--threads", type=int, default=10)
    p.add_argument("--cap", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    return p.parse_args()


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def drain(
    dsn: str, args: argparse.Namespace, cap: int | None, threads: list[int]
) -> tuple[float, float]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE sa_jobqueue_jobs, sa_jobqueue_queues, bench_results")
        conn.execute(
            "INSERT INTO sa_jobqueue_jobs (queue, task, payload)"
            " SELECT 'bench', %s, jsonb_build_object('n', n, 'ms', %s)"
            " FROM generate_series(1, %s) n",
            (args.task, args.ms, args.jobs),
        )
        conn.execute("VACUUM ANALYZE sa_jobqueue_jobs")
    if cap is not None:
        engine = create_engine(dsn)
        with engine.begin() as sa_conn:
            set_queue_concurrency(sa_conn, "bench", cap)
        engine.dispose()
    with tempfile.TemporaryDirectory() as records:
        env = {**os.environ, "BENCH_RECORD_DIR": records, "PYTHONPATH": str(ROOT)}
        env.pop("DATABASE_URL", None)
        cpu = children_cpu()
        command = [sys.executable, "-m", "sa_jobqueue", "--log-level", "WARNING", "worker"]
        command += ["bench.tasks:queue", "--database-url", dsn, "--burst", "--concurrency"]
        procs = [
            subprocess.Popen([*command, str(n)], cwd=ROOT, env=env, stdin=subprocess.DEVNULL)
            for n in threads
        ]
        for proc in procs:
            assert proc.wait(timeout=600) == 0
        cpu = children_cpu() - cpu
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'succeeded'),"
            " extract(epoch FROM max(finished_at) - min(started_at)) FROM sa_jobqueue_jobs"
        ).fetchone()
    assert row is not None
    done, span = row
    assert done == args.jobs, f"{done} of {args.jobs} succeeded"
    return args.jobs / float(span), cpu / args.jobs * 1e6


def main() -> int:
    args = parse_args()
    url = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    dsn = harness.recreate_database(url, DATABASE)
    try:
        engine = create_engine(dsn)
        upgrade(engine)
        engine.dispose()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE bench_results (n bigint NOT NULL)")
        spread = [args.cap // args.procs + (i < args.cap % args.procs) for i in range(args.procs)]
        shapes: list[tuple[str, int | None, list[int]]] = [
            ("uncapped", None, [args.threads] * args.procs),
            (f"cap {args.cap}", args.cap, [args.threads] * args.procs),
            (f"{args.cap} threads", None, [n for n in spread if n]),
        ]
        results: dict[str, list[tuple[float, float]]] = {name: [] for name, _, _ in shapes}
        for _ in range(args.rounds):
            for shape, cap, threads in shapes:
                rate, cpu = drain(dsn, args, cap, threads)
                results[shape].append((rate, cpu))
                print(f"{shape:12} {rate:8.0f} jobs/s   worker CPU {cpu:6.0f} µs/job", flush=True)
    finally:
        harness.drop_database(url, DATABASE)
    print(f"medians, {args.jobs} {args.task} jobs, {args.procs} x {args.threads} threads:")
    base = statistics.median(r for r, _ in results["uncapped"])
    for shape, runs in results.items():
        rate = statistics.median(r for r, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        print(
            f"  {shape:12} {rate:8.0f} jobs/s ({rate / base:4.2f}x)   worker CPU {cpu:6.0f} µs/job"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
