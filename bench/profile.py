"""What one job costs the worker: CPU per job and the statements each job sends.

    bench/.venv/bin/python bench/profile.py [--jobs N] [--concurrency C] [--handler write|noop]

Uses $DATABASE_URL's server (a database ``bench_profile`` is created and dropped). Enqueues the
jobs in bulk, drains them with one in-process ``Worker`` (run as a deployed worker runs, not in
burst mode, whose claim loop wakes at every finished job; stopped once no job is left), and
prints the drain's
rate, the process's CPU time per job (user + system, from getrusage: the worker's whole cost on
the client side, its threads together) and how many statements of each kind the worker sent
per job. The ``write`` handler inserts one row through ``ctx.session``, the exactly-once path;
``noop`` does nothing. Run it under ``py-spy record --gil`` to see where the CPU goes.
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if sys.path and Path(sys.path[0]).resolve() == ROOT / "bench":
    sys.path[0] = str(ROOT)

import sqlalchemy as sa  # noqa: E402
from sqlalchemy import event  # noqa: E402
from sqlalchemy.engine.default import DefaultDialect  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from bench import harness  # noqa: E402

RESULTS = sa.table("profile_results", sa.column("job_id"), sa.column("n"))
#: Jobs not finished yet.
LEFT = sa.text("SELECT count(*) FROM sa_jobqueue_jobs WHERE status IN ('queued', 'running')")


class Statements:
    """Counts the statements sent through an engine by their first words, thread-safely.

    Savepoints and their release go through the dialect rather than the cursor events, so they
    are counted where the dialect sends them; so is COMMIT.
    """

    def __init__(self, engine: sa.Engine) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        event.listen(engine, "before_cursor_execute", self._cursor)
        for name in ("do_savepoint", "do_release_savepoint", "do_commit"):
            self._wrap(engine.dialect, name)

    def _add(self, kind: str) -> None:
        with self._lock:
            self.counts[kind] += 1

    def _cursor(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        words = statement.split()
        if words and words[0] not in ("SAVEPOINT", "RELEASE"):  # counted by the dialect
            self._add(" ".join(words[:3]))

    def _wrap(self, dialect: DefaultDialect, name: str) -> None:
        method = getattr(dialect, name)
        label = {"do_savepoint": "SAVEPOINT", "do_release_savepoint": "RELEASE SAVEPOINT"}
        kind = label.get(name, "COMMIT")

        def counted(*args: Any) -> Any:
            self._add(kind)
            return method(*args)

        setattr(dialect, name, counted)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--handler", choices=("write", "noop"), default="write")
    args = parser.parse_args()
    admin = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    dsn = harness.recreate_database(admin, "bench_profile")
    try:
        from sa_jobqueue import JobContext, JobQueue, Worker
        from sa_jobqueue.database import create_engine
        from sa_jobqueue.migrations import upgrade

        engine = create_engine(dsn, pool_size=args.concurrency + 2)
        upgrade(engine)
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE profile_results (job_id bigint PRIMARY KEY, n int)")
        queue = JobQueue()

        @queue.task
        def write(ctx: JobContext, payload: dict[str, int]) -> None:
            ctx.session.execute(sa.insert(RESULTS).values(job_id=ctx.job_id, n=payload["n"]))

        @queue.task
        def noop(ctx: JobContext, payload: dict[str, int]) -> None:
            pass

        with Session(engine) as session, session.begin():
            queue.enqueue_many(session, args.handler, [{"n": n} for n in range(args.jobs)])
        with engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE sa_jobqueue_jobs")
        statements = Statements(engine)
        worker = Worker(queue, engine, concurrency=args.concurrency, listen=False)
        before = resource.getrusage(resource.RUSAGE_SELF)
        started = time.perf_counter()
        runner = threading.Thread(target=worker.run, name="profiled-worker")
        runner.start()
        watcher = create_engine(dsn, pool_size=1)  # its statements are not the worker's
        with watcher.connect() as conn:
            while conn.execute(LEFT).scalar_one():
                conn.rollback()
                time.sleep(0.02)
        elapsed = time.perf_counter() - started
        worker.stop()
        runner.join()
        watcher.dispose()
        after = resource.getrusage(resource.RUSAGE_SELF)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        with engine.connect() as conn:
            written = conn.exec_driver_sql("SELECT count(*) FROM profile_results").scalar_one()
        engine.dispose()
        print(
            f"{args.jobs:,} {args.handler} jobs, concurrency {args.concurrency}:"
            f" {args.jobs / elapsed:,.0f} jobs/s, worker CPU {cpu / args.jobs * 1e6:.0f} µs/job,"
            f" {written:,} rows written"
        )
        print("statements per job (the worker's own and its handlers'):")
        for kind, n in statements.counts.most_common():
            if n >= args.jobs // 1000:
                print(f"  {n / args.jobs:7.3f}  {kind}")
        return 0
    finally:
        harness.drop_database(admin, "bench_profile")


if __name__ == "__main__":
    raise SystemExit(main())
