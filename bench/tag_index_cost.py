"""What tags and meta, and a GIN index on tags, cost the enqueue, the claim and the completion.

    bench/.venv/bin/python bench/tag_index_cost.py [--jobs N] [--rounds R]

Uses $DATABASE_URL's server (a database ``bench_tag_index_cost`` is created and dropped). Three
variants, each round in turn so that a machine's changing load falls on all of them alike:
``plain`` (jobs without tags or meta), ``tagged`` (three tags and a two-key meta each, no index:
what sa_jobqueue ships) and ``tagged+gin`` (the same with ``CREATE INDEX ... USING gin
(tags)``). For each: ``--jobs`` jobs enqueued in one ``enqueue_many`` (by COPY), then claimed
20 at a time with the worker's claim statement and completed with its batched completion
(``transitions.complete_many``) on one autocommit connection with nothing else running. Each
line gives, per job, the wall time and the WAL written (``pg_current_wal_lsn`` before and
after: what the server wrote, which a busy machine's load does not change), medians over the
rounds, and the sizes of the table's indexes at the end.
"""

from __future__ import annotations

import argparse
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
from sa_jobqueue._sql import claiming, transitions  # noqa: E402
from sa_jobqueue._sql.fence import held_many  # noqa: E402
from sa_jobqueue.database import create_engine  # noqa: E402
from sa_jobqueue.migrations import upgrade  # noqa: E402

queue = JobQueue()


@queue.task()
def noop(ctx: JobContext, payload: object) -> None:
    pass


TAGGED: dict[str, Any] = {
    "tags": ["bench", "drain", "customer:42"],
    "meta": {"source": "bench", "request": "7f3c9a2e4b1d"},
}
VARIANTS: dict[str, tuple[dict[str, Any], bool]] = {
    "plain": ({}, False),
    "tagged": (TAGGED, False),
    "tagged+gin": (TAGGED, True),
}
BATCH = 20
LSN = sa.text("SELECT pg_current_wal_lsn()")


def wal_since(conn: sa.Connection, start: str) -> int:
    query = sa.text("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), :start)::bigint")
    return int(conn.execute(query, {"start": start}).scalar_one())


def one_round(engine: sa.Engine, jobs: int, options: dict[str, Any], gin: bool) -> dict[str, float]:
    with engine.begin() as conn:
        conn.execute(sa.text("TRUNCATE sa_jobqueue_jobs"))
        conn.execute(sa.text("DROP INDEX IF EXISTS sa_jobqueue_jobs_tags_idx"))
        if gin:
            conn.execute(
                sa.text(
                    "CREATE INDEX sa_jobqueue_jobs_tags_idx ON sa_jobqueue_jobs USING gin (tags)"
                )
            )
    measured: dict[str, float] = {}
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        start = conn.execute(LSN).scalar_one()
        began = time.perf_counter()
        with Session(engine) as session, session.begin():
            queue.enqueue_many(session, "noop", [{"n": n} for n in range(jobs)], **options)
        measured["enqueue us"] = (time.perf_counter() - began) / jobs * 1e6
        measured["enqueue WAL B"] = wal_since(conn, start) / jobs
        conn.execute(sa.text("ANALYZE sa_jobqueue_jobs"))
        claim = {"from_queue": "default", "limit": BATCH, "worker": "bench"}
        start = conn.execute(LSN).scalar_one()
        began = time.perf_counter()
        done = 0
        while rows := conn.execute(claiming.claim(), claim).all():
            pairs = [(row.id, row.attempts) for row in rows]
            conn.execute(transitions.complete_many(), {**held_many(pairs), "results": "{}"}).all()
            done += len(pairs)
        assert done == jobs, done
        measured["claim+complete us"] = (time.perf_counter() - began) / jobs * 1e6
        measured["claim+complete WAL B"] = wal_since(conn, start) / jobs
        sizes = conn.execute(
            sa.text(
                "SELECT coalesce(sum(pg_relation_size(indexrelid)), 0) FROM pg_index"
                " WHERE indrelid = 'sa_jobqueue_jobs'::regclass"
            )
        ).scalar_one()
        measured["index kB"] = sizes / 1024
    return measured


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=20_000, help="jobs per round (default 20000)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of each variant (default 3)")
    args = p.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    print(f"Command: {' '.join(['bench/tag_index_cost.py', *sys.argv[1:]])}  (commit {commit})")
    results: dict[str, list[dict[str, float]]] = {name: [] for name in VARIANTS}
    with harness.scratch_database("bench_tag_index_cost") as dsn:
        engine = create_engine(dsn)
        upgrade(engine)
        for _ in range(args.rounds):
            for name, (options, gin) in VARIANTS.items():
                results[name].append(one_round(engine, args.jobs, options, gin))
        engine.dispose()
    measures = list(results["plain"][0])
    print(f"{args.jobs:,} jobs a round, claimed {BATCH} at a time; medians of {args.rounds} rounds")
    print(f"{'variant':<12}" + "".join(f"{m:>22}" for m in measures))
    for name, rounds in results.items():
        cells = [statistics.median(r[m] for r in rounds) for m in measures]
        print(f"{name:<12}" + "".join(f"{c:>22.1f}" for c in cells))


if __name__ == "__main__":
    main()
