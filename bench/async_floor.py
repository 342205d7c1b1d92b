"""What SQLAlchemy's asyncio layer costs by itself: one writing job's statements, no queue.

    bench/.venv/bin/python bench/async_floor.py [--jobs N]

Uses $DATABASE_URL's server (a database ``bench_async_floor`` is created and dropped). Runs,
on one thread and one connection at a time, what a job that writes one row through its
session sends with its completion (an INSERT, an UPDATE of one row by its key, a COMMIT), N
times each way: through a sync ``Session``, through an ``AsyncSession`` (with and without
the pool's pre-ping), and through psycopg's ``AsyncConnection`` alone. It prints each way's
CPU time per job (this process's, user + system) and its wall time per job.

The point of it: sa_jobqueue runs ``async def`` handlers on one event loop, and sync handlers
on threads that share one interpreter lock, so in both a writing drain is bound by the
client's CPU per job; what SQLAlchemy's asyncio layer adds to each statement is a floor no
worker can go under while handlers write through ``ctx.async_session``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if sys.path and Path(sys.path[0]).resolve() == ROOT / "bench":
    sys.path[0] = str(ROOT)

import psycopg  # noqa: E402
import sqlalchemy as sa  # noqa: E402
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from bench import harness  # noqa: E402

INSERT = sa.text("INSERT INTO floor_rows (n) VALUES (:n)")
UPDATE = sa.text("UPDATE floor_rows SET n = n WHERE id = :id")


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def sync_session(url: str, jobs: int) -> None:
    engine = sa.create_engine(url, pool_pre_ping=True)
    for n in range(jobs):
        with Session(engine) as session:
            session.execute(INSERT, {"n": n})
            session.execute(UPDATE, {"id": n})
            session.commit()
    engine.dispose()


async def async_session(url: str, jobs: int, pre_ping: bool) -> None:
    engine = create_async_engine(url, pool_pre_ping=pre_ping)
    for n in range(jobs):
        async with AsyncSession(bind=engine) as session:
            await session.execute(INSERT, {"n": n})
            await session.execute(UPDATE, {"id": n})
            await session.commit()
    await engine.dispose()


async def async_psycopg(dsn: str, jobs: int) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        for n in range(jobs):
            async with conn.transaction():
                await conn.execute("INSERT INTO floor_rows (n) VALUES (%s)", (n,))
                await conn.execute("UPDATE floor_rows SET n = n WHERE id = %s", (n,))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=3_000)
    args = parser.parse_args()
    admin = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    dsn = harness.recreate_database(admin, "bench_async_floor")
    url = "postgresql+psycopg://" + dsn.split("://", 1)[1]
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE floor_rows (id bigserial PRIMARY KEY, n int)")
        ways: list[tuple[str, Callable[[], None]]] = [
            ("sync Session", lambda: sync_session(url, args.jobs)),
            ("AsyncSession, pre-ping", lambda: asyncio.run(async_session(url, args.jobs, True))),
            ("AsyncSession", lambda: asyncio.run(async_session(url, args.jobs, False))),
            ("psycopg AsyncConnection", lambda: asyncio.run(async_psycopg(dsn, args.jobs))),
        ]
        ways[0][1]()  # warm-up: imports, the server's caches
        print(f"{args.jobs:,} jobs each (INSERT, UPDATE by key, COMMIT), one at a time:")
        for name, run in ways:
            before, started = cpu(), time.perf_counter()
            run()
            spent, elapsed = cpu() - before, time.perf_counter() - started
            print(
                f"  {name:<26} {spent / args.jobs * 1e6:6.0f} µs CPU/job"
                f"  {elapsed / args.jobs * 1e6:6.0f} µs wall/job"
            )
        return 0
    finally:
        harness.drop_database(admin, "bench_async_floor")


if __name__ == "__main__":
    raise SystemExit(main())
