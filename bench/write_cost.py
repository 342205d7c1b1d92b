"""What a writing job's database work costs the worker's client, piece by piece.

    bench/.venv/bin/python bench/write_cost.py [--calls N] [--rounds R]

Uses $DATABASE_URL's server (a database ``bench_write_cost`` is created and dropped). On one
connection of the worker's group engine, in an open transaction (as a job thread holds one
while its group fills), it times the client CPU per call (``time.process_time``) of:

- the ``write`` benchmark handler's one-row INSERT sent by psycopg on a kept cursor, by
  psycopg's ``conn.execute``, by SQLAlchemy's ``Connection.execute`` and by a ``Session``'s
  ``execute``;
- a job's savepoint: the ``SAVEPOINT`` statement alone at the driver, and the savepoint as the
  worker makes it for a grouped job (its ``GroupSession`` opened, begun, committed, closed);
- a whole grouped job's session work: that savepoint with the INSERT through the session, as
  ``ctx.session`` runs it.

Rounds alternate between the variants, and each line is the median over the rounds, so a
change of the machine's speed during the run falls on every line alike. The group's share of
its ``COMMIT`` and of the fenced completion, and the claim, are not in these figures:
``bench/profile.py`` counts each statement a job sends.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if sys.path and Path(sys.path[0]).resolve() == ROOT / "bench":
    sys.path[0] = str(ROOT)

import sqlalchemy as sa  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from bench import harness  # noqa: E402
from sa_jobqueue.database import create_engine  # noqa: E402
from sa_jobqueue.worker._sessions import GroupSession, group_engine  # noqa: E402

DATABASE = "bench_write_cost"
#: The ``write`` benchmark handler's statement (bench.tasks), and psycopg's spelling of it.
INSERT = sa.text("INSERT INTO bench_results (n) VALUES (:n)")
RAW_INSERT = "INSERT INTO bench_results (n) VALUES (%s)"


def variants(conn: sa.Connection) -> dict[str, Callable[[int], object]]:
    raw: Any = conn.connection.driver_connection
    cursor = raw.cursor()
    session = Session(bind=conn, join_transaction_mode="rollback_only")

    def savepoint_as_the_worker_makes_it(n: int) -> None:
        job = GroupSession(conn)
        job.connection()
        job.commit_for_real()
        job.close()

    def grouped_job(n: int) -> None:
        job = GroupSession(conn)
        job.execute(INSERT, {"n": n})
        job.flush()
        job.commit_for_real()
        job.close()

    calls: list[Callable[[int], object]] = [
        lambda n: cursor.execute(RAW_INSERT, (n,)),
        lambda n: raw.execute(RAW_INSERT, (n,)),
        lambda n: conn.execute(INSERT, {"n": n}),
        lambda n: session.execute(INSERT, {"n": n}),
        lambda n: raw.execute("SAVEPOINT bench"),
        savepoint_as_the_worker_makes_it,
        grouped_job,
    ]
    return dict(zip(NAMES, calls, strict=True))


NAMES = (
    "INSERT, psycopg, cursor kept",
    "INSERT, psycopg conn.execute",
    "INSERT, SQLAlchemy Connection.execute",
    "INSERT, SQLAlchemy Session.execute",
    "SAVEPOINT at the driver",
    "a grouped job's savepoint (GroupSession)",
    "a grouped job: savepoint + INSERT (ctx.session)",
)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=500, help="calls per variant per round")
    p.add_argument("--rounds", type=int, default=7, help="alternating rounds (medians)")
    args = p.parse_args()
    with harness.scratch_database(DATABASE) as dsn:
        engine = create_engine(dsn)
        with engine.begin() as setup:
            setup.exec_driver_sql("CREATE TABLE bench_results (n integer)")
        samples: dict[str, list[float]] = {}
        with group_engine(engine).connect() as conn:
            for counted in [False] + [True] * args.rounds:  # the first round warms up
                for name in NAMES:
                    # A transaction per variant and round, so that no variant runs deep in
                    # the savepoints of another.
                    transaction = conn.begin()
                    try:
                        call = variants(conn)[name]
                        for n in range(10):  # psycopg prepares a statement at its 5th run
                            call(n)
                        started = time.process_time()
                        for n in range(args.calls):
                            call(n)
                        spent = time.process_time() - started
                    finally:
                        transaction.rollback()
                    if counted:
                        samples.setdefault(name, []).append(spent / args.calls * 1e6)
        engine.dispose()
    base = statistics.median(samples["INSERT, psycopg, cursor kept"])
    print(f"client CPU per call, median of {args.rounds} rounds of {args.calls} calls")
    for name, values in samples.items():
        value = statistics.median(values)
        print(f"  {name:<50} {value:7.1f} µs  {value / base:5.2f}x")
    print("  (ratios: to the INSERT by psycopg on a kept cursor)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
