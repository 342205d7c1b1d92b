"""Many queues: a drain of N one-job queues against N jobs in one queue, and an idle worker's cost.

    bench/.venv/bin/python bench/many_queues.py [--queues N] [--threads T] [--rounds R]
        [--idle-seconds S]

Uses $DATABASE_URL's server (a database ``bench_many_queues`` is created and dropped). Each
drain loads ``--queues`` no-op jobs (``bench.tasks:noop``) and runs one
``sa-jobqueue worker --burst`` of ``--threads`` threads over them, the shapes alternating:

- ``one queue``: all the jobs in queue ``tenant-00000``, the worker given that one queue;
- ``N queues, pattern``: one job in each of N queues, the worker given ``--queues 'tenant-*'``;
- ``N queues, file``: the same, the worker given the N names in a ``--queues-file``.

The rate is jobs over the database's span from the first start to the last finish. Then the
idle cost: one worker started on each shape with nothing due (the N queues each hold a job
scheduled an hour ahead, so the claim's walk has them all to step over), and the database's
committed transactions per second (``pg_stat_database.xact_commit``) over ``--idle-seconds``,
counted from the worker's first claim on; every statement of the worker is its own
transaction (autocommit). Prints each run, the medians, and the ratios to the one-queue drain.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if sys.path and Path(sys.path[0]).resolve() == ROOT / "bench":
    sys.path[0] = str(ROOT)

import psycopg  # noqa: E402

from bench import harness  # noqa: E402
from sa_jobqueue.database import create_engine  # noqa: E402
from sa_jobqueue.migrations import upgrade  # noqa: E402

DATABASE = "bench_many_queues"
LOAD = (
    "INSERT INTO sa_jobqueue_jobs (queue, task, payload, visible_at)"
    " SELECT CASE WHEN %(one)s THEN 'tenant-00000' ELSE 'tenant-' || lpad(n::text, 5, '0') END,"
    " 'noop', jsonb_build_object('n', n), now() + %(delay)s * interval '1 second'"
    " FROM generate_series(0, %(n)s - 1) n"
)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--queues", type=int, default=10_000, help="N: queues, and jobs per drain")
    p.add_argument("--threads", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--idle-seconds", type=float, default=10.0)
    return p.parse_args()


def load(dsn: str, n: int, *, one: bool, delay: float = 0.0) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE sa_jobqueue_jobs, sa_jobqueue_queues, bench_results")
        conn.execute(LOAD, {"one": one, "n": n, "delay": delay})
        conn.execute("VACUUM ANALYZE sa_jobqueue_jobs")


def worker_command(dsn: str, threads: int, served: list[str]) -> list[str]:
    command = [sys.executable, "-m", "sa_jobqueue", "--log-level", "ERROR", "worker"]
    command += ["bench.tasks:queue", "--database-url", dsn, "--concurrency", str(threads)]
    return command + served


def environment(records: str) -> dict[str, str]:
    env = {**os.environ, "BENCH_RECORD_DIR": records, "PYTHONPATH": str(ROOT)}
    env.pop("DATABASE_URL", None)
    return env


def drain(dsn: str, args: argparse.Namespace, one: bool, served: list[str]) -> float:
    load(dsn, args.queues, one=one)
    with tempfile.TemporaryDirectory() as records:
        command = [*worker_command(dsn, args.threads, served), "--burst"]
        done = subprocess.run(command, cwd=ROOT, env=environment(records), timeout=900)
        assert done.returncode == 0
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'succeeded'),"
            " extract(epoch FROM max(finished_at) - min(started_at)) FROM sa_jobqueue_jobs"
        ).fetchone()
    assert row is not None
    finished, span = row
    assert finished == args.queues, f"{finished} of {args.queues} succeeded"
    return args.queues / float(span)


def commits(conn: psycopg.Connection[tuple[int]]) -> int:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    assert row is not None
    return int(row[0])


def idle(dsn: str, args: argparse.Namespace, one: bool, served: list[str]) -> float:
    """Transactions per second of the database with one idle worker (and this watcher)."""
    load(dsn, args.queues, one=one, delay=3600)
    with tempfile.TemporaryDirectory() as records, psycopg.connect(dsn, autocommit=True) as conn:
        proc = subprocess.Popen(
            worker_command(dsn, args.threads, served), cwd=ROOT, env=environment(records)
        )
        try:
            # Until the worker is registered and past its start (the schema check, the first
            # claims), then one window; the server flushes its counters at most once a second.
            deadline = time.monotonic() + 60
            while not conn.execute("SELECT 1 FROM sa_jobqueue_workers").fetchone():
                assert proc.poll() is None
                assert time.monotonic() < deadline
                time.sleep(0.2)
            time.sleep(3)
            before, began = commits(conn), time.monotonic()
            time.sleep(args.idle_seconds)
            after, ended = commits(conn), time.monotonic()
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    # The watcher's own two reads are its commits in the window.
    return (after - before - 2) / (ended - began)


def main() -> int:
    args = parse_args()
    url = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    dsn = harness.recreate_database(url, DATABASE)
    n = args.queues
    try:
        engine = create_engine(dsn)
        upgrade(engine)
        engine.dispose()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE bench_results (n bigint NOT NULL)")
        with tempfile.TemporaryDirectory() as tmp:
            listed = Path(tmp) / "queues.txt"
            listed.write_text("\n".join(f"tenant-{i:05d}" for i in range(n)) + "\n")
            shapes: list[tuple[str, bool, list[str]]] = [
                ("one queue", True, ["--queues", "tenant-00000"]),
                (f"{n} queues, pattern", False, ["--queues", "tenant-*"]),
                (f"{n} queues, file", False, ["--queues-file", str(listed)]),
            ]
            rates: dict[str, list[float]] = {name: [] for name, _, _ in shapes}
            for _ in range(args.rounds):
                for shape, one, served in shapes:
                    rate = drain(dsn, args, one, served)
                    rates[shape].append(rate)
                    print(f"drain {shape:22} {rate:8.0f} jobs/s", flush=True)
            idles = {shape: idle(dsn, args, one, served) for shape, one, served in shapes}
    finally:
        harness.drop_database(url, DATABASE)
    print(f"medians of {args.rounds}, {n} no-op jobs, 1 worker x {args.threads} threads:")
    base = statistics.median(rates["one queue"])
    for shape, runs in rates.items():
        rate = statistics.median(runs)
        print(
            f"  drain {shape:22} {rate:8.0f} jobs/s   one queue's time x {base / rate:4.2f}"
            f"   idle: {idles[shape]:5.1f} transactions/s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
