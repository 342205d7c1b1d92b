"""A chord of 10,000 members run by real workers: how long it takes, and how soon after the
last member ends the callback starts.

    bench/.venv/bin/python bench/chord.py [--members N] [--procs P] [--threads T] [--rounds R]

Uses $DATABASE_URL's server (a database ``bench_chord`` is created and dropped). Each round
declares the chord in one transaction (``JobQueue.chord``: the members by COPY, the callback
with an edge to each), then drains it with ``--procs`` ``sa-jobqueue worker --burst``
processes. The delay is the callback's ``started_at`` minus the latest member's
``finished_at``, both by the database clock.
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
from sqlalchemy.orm import Session  # noqa: E402

from bench import harness  # noqa: E402
from bench.workflow_tasks import queue  # noqa: E402
from sa_jobqueue.database import create_engine  # noqa: E402
from sa_jobqueue.migrations import upgrade  # noqa: E402
from sa_jobqueue.workflows import Call  # noqa: E402

DATABASE = "bench_chord"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--members", type=int, default=10_000)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--threads", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    return p.parse_args()


def one_round(dsn: str, args: argparse.Namespace) -> tuple[float, float, float]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE sa_jobqueue_jobs, sa_jobqueue_dependencies")
    engine = create_engine(dsn)
    started = time.perf_counter()
    with Session(engine) as session, session.begin():
        *_, callback = queue.chord(
            session, [Call("member", {"n": n}) for n in range(args.members)], Call("gather")
        )
    declared = time.perf_counter() - started
    engine.dispose()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("DATABASE_URL", None)
    command = [sys.executable, "-m", "sa_jobqueue", "--log-level", "WARNING", "worker"]
    command += ["bench.workflow_tasks:queue", "--database-url", dsn, "--burst"]
    command += ["--concurrency", str(args.threads)]
    procs = [
        subprocess.Popen(command, cwd=ROOT, env=env, stdin=subprocess.DEVNULL)
        for _ in range(args.procs)
    ]
    for proc in procs:
        assert proc.wait(timeout=600) == 0
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT (SELECT started_at FROM sa_jobqueue_jobs WHERE id = %(cb)s)"
            " - max(finished_at), max(finished_at) - min(started_at),"
            " (SELECT result FROM sa_jobqueue_jobs WHERE id = %(cb)s),"
            " count(*) FILTER (WHERE status = 'succeeded')"
            " FROM sa_jobqueue_jobs WHERE id <> %(cb)s",
            {"cb": callback},
        ).fetchone()
    assert row is not None
    delay, span, result, done = row
    assert done == args.members, done
    assert result == sum(range(args.members)), result
    return declared, span.total_seconds(), delay.total_seconds()


def main() -> int:
    args = parse_args()
    url = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    dsn = harness.recreate_database(url, DATABASE)
    try:
        engine = create_engine(dsn)
        upgrade(engine)
        engine.dispose()
        runs = []
        for _ in range(args.rounds):
            declared, span, delay = one_round(dsn, args)
            runs.append((declared, span, delay))
            print(
                f"declared in {declared * 1000:7.1f} ms   members ran in {span:6.2f} s"
                f"   callback started {delay * 1000:6.1f} ms after the last member",
                flush=True,
            )
    finally:
        harness.drop_database(url, DATABASE)
    print(
        f"medians, {args.members} members, {args.procs} x {args.threads} threads:"
        f" declared {statistics.median(r[0] for r in runs) * 1000:.1f} ms,"
        f" ran {statistics.median(r[1] for r in runs):.2f} s,"
        f" callback {statistics.median(r[2] for r in runs) * 1000:.1f} ms after the last member"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
