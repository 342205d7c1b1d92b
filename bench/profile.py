"""What one job costs the worker: CPU per job and the statements each job sends.

    bench/.venv/bin/python bench/profile.py [--jobs N] [--concurrency C] [--handler KIND]

Uses $DATABASE_URL's server (a database ``bench_profile`` is created and dropped). Enqueues the
jobs in bulk, drains them with one in-process ``Worker`` (run as a deployed worker runs, not in
burst mode, whose claim loop wakes at every finished job; stopped once no job is left), and
prints the drain's
rate, the process's CPU time per job (user + system, from getrusage: the worker's whole cost on
the client side, its threads together) and how many statements of each kind the worker sent
per job. The ``write`` handler inserts one row through ``ctx.session``, the exactly-once path;
``noop`` does nothing; ``sleep_1ms`` waits a millisecond. Each has an ``async def`` twin
(``write_async`` writes through ``ctx.async_session``), run on the worker's event loop. Run it
under ``py-spy record --gil`` to see where the CPU goes.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import resource
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if sys.path and Path(sys.path[0]).resolve() == ROOT / "bench":
    sys.path[0] = str(ROOT)

import psycopg  # noqa: E402
import sqlalchemy as sa  # noqa: E402
from psycopg import sql  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from bench import harness  # noqa: E402

RESULTS = sa.table("profile_results", sa.column("job_id"), sa.column("n"))
BATCH_INSERT = sa.text(
    "INSERT INTO profile_results (job_id, n)"
    " SELECT * FROM unnest(CAST(:ids AS bigint[]), CAST(:ns AS integer[]))"
)
#: Jobs not finished yet.
LEFT = sa.text("SELECT count(*) FROM sa_jobqueue_jobs WHERE status IN ('queued', 'running')")


class Statements:
    """Counts the statements the worker's threads send, by their first words, thread-safely.

    Counted where they are sent (psycopg's cursor ``execute``, the libpq commands a group's
    savepoints go as, and the connection's ``commit`` and ``rollback``), so that a statement
    counts only if it is sent: the worker sends some below SQLAlchemy and SQLAlchemy skips some
    it is asked for. The main thread, which watches the drain, is left out.
    """

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        execute = psycopg.Cursor.execute

        def counted_execute(cursor: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            self._count(query, cursor.connection)
            return execute(cursor, query, *args, **kwargs)

        psycopg.Cursor.execute = counted_execute  # type: ignore[method-assign]
        aexecute = psycopg.AsyncCursor.execute

        async def counted_aexecute(cursor: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            self._count(query, cursor.connection)
            return await aexecute(cursor, query, *args, **kwargs)

        psycopg.AsyncCursor.execute = counted_aexecute  # type: ignore[method-assign]
        from sa_jobqueue.worker import _sessions

        command = _sessions.command

        def counted_command(driver: Any, statement: sql.Composed) -> None:
            self._count(statement, driver)
            command(driver, statement)

        _sessions.command = counted_command
        for name in ("commit", "rollback"):
            self._wrap(name)

    def _count(self, query: Any, connection: Any) -> None:
        """Count ``query`` (text, bytes or a psycopg Composable) by its first words."""
        if isinstance(query, sql.Composable):
            query = query.as_string(connection)
        elif isinstance(query, bytes):
            query = query.decode()
        words = str(query).split()
        # Savepoint names differ each time: count the kind of statement only.
        self._add(" ".join(w for w in words[:3] if not w.startswith('"')))

    def _add(self, kind: str) -> None:
        if threading.current_thread() is threading.main_thread():
            return
        with self._lock:
            self.counts[kind] += 1

    def _wrap(self, name: str) -> None:
        method = getattr(psycopg.Connection, name)

        def counted(connection: Any) -> Any:
            self._add(name.upper())
            return method(connection)

        setattr(psycopg.Connection, name, counted)
        amethod = getattr(psycopg.AsyncConnection, name)

        async def acounted(connection: Any) -> Any:
            self._add(name.upper())
            return await amethod(connection)

        setattr(psycopg.AsyncConnection, name, acounted)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=10)
    kinds = ("write", "noop", "sleep_1ms")
    parser.add_argument(
        "--handler",
        choices=(*kinds, *(f"{k}_async" for k in kinds), "batch_write"),
        default="write",
    )
    args = parser.parse_args()
    admin = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    dsn = harness.recreate_database(admin, "bench_profile")
    try:
        from sa_jobqueue import BatchContext, BatchJob, JobContext, JobQueue, Worker
        from sa_jobqueue.database import create_engine
        from sa_jobqueue.migrations import upgrade

        engine = create_engine(dsn, pool_size=args.concurrency + 2)
        upgrade(engine)
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE profile_results (job_id bigint PRIMARY KEY, n int)")
        queue = JobQueue()

        def write(ctx: JobContext, payload: dict[str, int]) -> None:
            ctx.session.execute(sa.insert(RESULTS).values(job_id=ctx.job_id, n=payload["n"]))

        def noop(ctx: JobContext, payload: dict[str, int]) -> None:
            pass

        def sleep_1ms(ctx: JobContext, payload: dict[str, int]) -> None:
            time.sleep(0.001)

        async def write_async(ctx: JobContext, payload: dict[str, int]) -> None:
            values = {"job_id": ctx.job_id, "n": payload["n"]}
            await ctx.async_session.execute(sa.insert(RESULTS).values(**values))

        async def noop_async(ctx: JobContext, payload: dict[str, int]) -> None:
            pass

        async def sleep_1ms_async(ctx: JobContext, payload: dict[str, int]) -> None:
            await asyncio.sleep(0.001)

        def batch_write(ctx: BatchContext, jobs: list[BatchJob[dict[str, int]]]) -> None:
            # One multi-row INSERT per batch, as bench/tasks.py's batch task writes.
            ctx.session.execute(
                BATCH_INSERT,
                {"ids": [job.id for job in jobs], "ns": [job.payload["n"] for job in jobs]},
            )

        # Only the handler profiled: a queue with an async handler runs an event loop beside
        # its threads, and each kind gets a lane's room.
        handlers = (write, noop, sleep_1ms, write_async, noop_async, sleep_1ms_async)
        if args.handler == "batch_write":
            queue.batch_task(max_size=500, max_wait=timedelta(milliseconds=50))(batch_write)
        else:
            queue.task({h.__name__: h for h in handlers}[args.handler])

        with Session(engine) as session, session.begin():
            queue.enqueue_many(session, args.handler, [{"n": n} for n in range(args.jobs)])
        with engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE sa_jobqueue_jobs")
        statements = Statements()
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
        user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
        switches = after.ru_nvcsw - before.ru_nvcsw + after.ru_nivcsw - before.ru_nivcsw
        with engine.connect() as conn:
            written = conn.exec_driver_sql("SELECT count(*) FROM profile_results").scalar_one()
        engine.dispose()
        per_job = {"cpu": user + system, "user": user, "system": system}
        us = {name: f"{seconds / args.jobs * 1e6:.0f}" for name, seconds in per_job.items()}
        print(
            f"{args.jobs:,} {args.handler} jobs, concurrency {args.concurrency}:"
            f" {args.jobs / elapsed:,.0f} jobs/s, worker CPU {us['cpu']} µs/job"
            f" (user {us['user']}, system {us['system']}),"
            f" {switches / args.jobs:.2f} context switches/job, {written:,} rows written"
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
