"""What one enqueue costs: round trips, client CPU, and the batch size where COPY starts to pay.

    bench/.venv/bin/python bench/enqueue_cost.py [--calls N] [--sizes 10,100,1000] [--rounds R]

Uses $DATABASE_URL's server (a database ``bench_enqueue_cost`` is created and dropped). Prints:

1. Round trips per call, counted in libpq's protocol trace of the engine's one connection (a
   round trip ends with a Sync, a simple Query or a CopyDone message): (a) a Session per
   enqueue, committed; (b) an enqueue in a transaction that has already run a statement;
   (c) ``enqueue_many`` of each size, committed.
2. Client CPU per call (``time.process_time``) of shapes (a) and (b), of the same INSERT and
   COMMIT sent with psycopg alone (for (a)), and of a raw psycopg INSERT of the same row on
   (b)'s connection, in its transaction (for (b)): the INSERT as one would write it by hand,
   sent by ``conn.execute`` (a cursor per call) and by a cursor kept across calls. Rounds
   alternate between them; medians, and (b)'s ratio to each raw INSERT.
3. ``enqueue_many`` of each size by INSERT and by COPY (forced by setting
   ``sa_jobqueue._enqueue.inserting.COPY_FROM``), alternating, medians of wall time and CPU per job.

Commits are made with ``synchronous_commit=off`` unless ``--sync-commit on``: the fsync costs
every shape and path the same, and on a shared disk it is mostly noise.

CPU time on a busy machine is noisy; instructions are not. ``--instructions`` (needs valgrind)
prints instead the user-space instructions per call of (b) and of the two raw INSERTs, each run
under callgrind twice (``--calls`` and ten times as many, after the same set-up: the difference
over the extra calls is the per-call cost). The kernel's share of a round trip (the socket
calls, the same for all three) is not counted.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if sys.path and Path(sys.path[0]).resolve() == ROOT / "bench":
    sys.path[0] = str(ROOT)

import psycopg  # noqa: E402
import sqlalchemy as sa  # noqa: E402
from psycopg import pq  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from bench import harness  # noqa: E402
from sa_jobqueue import JobContext, JobQueue  # noqa: E402
from sa_jobqueue._enqueue import inserting  # noqa: E402
from sa_jobqueue._sql import enqueue as enqueue_sql  # noqa: E402
from sa_jobqueue.database import create_engine  # noqa: E402
from sa_jobqueue.migrations import upgrade  # noqa: E402

DATABASE = "bench_enqueue_cost"
queue = JobQueue(default_queue="bench")


@queue.task
def noop(ctx: JobContext, payload: Any) -> None:
    """Never run here: the jobs are only enqueued."""


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=2000, help="calls per CPU measurement")
    p.add_argument("--sizes", default="10,50,100,200,500,1000,5000", help="enqueue_many sizes")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds (medians)")
    p.add_argument("--sync-commit", default="off", choices=("on", "off"))
    p.add_argument("--database", default=DATABASE, help="the database made for the run")
    p.add_argument(
        "--instructions", action="store_true", help="instructions per call, under callgrind"
    )
    # Internal: the one loop that --instructions runs under callgrind.
    p.add_argument("--only", choices=tuple(ONE_ROW), help=argparse.SUPPRESS)
    return p.parse_args()


#: A raw psycopg INSERT of the row (b) enqueues, as one would write it by hand.
RAW_INSERT = (
    "INSERT INTO sa_jobqueue_jobs (queue, task, payload, priority, max_attempts, lease)"
    " VALUES (%s, %s, %s, %s, %s, make_interval(secs => %s)) RETURNING id"
)
RAW_VALUES = ("bench", "noop", '{"n":1}', 0, 5, 30.0)


def one_row(session: Session) -> dict[str, Callable[[], object]]:
    """(b) and the two raw INSERTs of the same row, on ``session``'s connection, in its
    transaction (begun and warmed up here: psycopg prepares a statement at its 5th run)."""
    session.execute(sa.text("SELECT 1"))
    raw: Any = session.connection().connection.driver_connection
    cursor = raw.cursor()
    variants: dict[str, Callable[[], object]] = {
        "(b) enqueue in an open transaction": lambda: queue.enqueue(session, noop, {"n": 1}),
        "raw psycopg INSERT, conn.execute": lambda: raw.execute(RAW_INSERT, RAW_VALUES).fetchone(),
        "raw psycopg INSERT, cursor kept": lambda: (
            cursor.execute(RAW_INSERT, RAW_VALUES),
            cursor.fetchone(),
        ),
    }
    for call in variants.values():
        for _ in range(10):
            call()
    return variants


ONE_ROW = {"b": 0, "execute": 1, "cursor": 2}


class Trace:
    """Round trips on one psycopg connection, from libpq's protocol trace."""

    def __init__(self, pgconn: Any) -> None:
        self.pgconn = pgconn

    @contextmanager
    def counting(self) -> Iterator[collections.Counter[str]]:
        counts: collections.Counter[str] = collections.Counter()
        with tempfile.TemporaryFile("w+b") as out:
            self.pgconn.trace(out.fileno())
            self.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
            try:
                yield counts
            finally:
                self.pgconn.untrace()
                out.flush()
                out.seek(0)
                for line in out.read().decode(errors="replace").splitlines():
                    fields = line.split("\t")
                    if len(fields) > 2 and fields[0] == "F":
                        counts[fields[2].split()[0]] += 1

    def round_trips(self, call: Callable[[], object], times: int = 20) -> float:
        with self.counting() as counts:
            for _ in range(times):
                call()
        # A Sync or a simple Query ends a request; CopyDone too (COPY waits for its result).
        return (counts["Sync"] + counts["Query"] + counts["CopyDone"]) / times


def alternate(
    variants: dict[str, Callable[[], object]], calls: int, rounds: int
) -> dict[str, float]:
    """Median per-call CPU (and wall) of each variant, over rounds that alternate them; the
    CPU medians are returned."""
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    wall: dict[str, list[float]] = {name: [] for name in variants}
    for call in variants.values():
        for _ in range(max(calls // 10, 20)):
            call()
    for _ in range(rounds):
        for name, call in variants.items():
            c0, w0 = time.process_time(), time.perf_counter()
            for _ in range(calls):
                call()
            cpu[name].append((time.process_time() - c0) / calls * 1e6)
            wall[name].append((time.perf_counter() - w0) / calls * 1e6)
    for name in variants:
        print(
            f"  {name:52} CPU {statistics.median(cpu[name]):7.1f} µs"
            f"   wall {statistics.median(wall[name]):7.1f} µs"
        )
    return {name: statistics.median(values) for name, values in cpu.items()}


def main() -> int:
    args = parse_args()
    url = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    if args.only:
        return only(harness.database_url(url, args.database), args)
    dsn = harness.recreate_database(url, args.database)
    if args.instructions:
        try:
            engine = create_engine(dsn)
            upgrade(engine)
            engine.dispose()
            instructions(args)
        finally:
            harness.drop_database(url, args.database)
        return 0
    settings = {"synchronous_commit": args.sync_commit}
    # One connection, so that section 1 traces every statement; section 2 needs two.
    traced = create_engine(dsn, pool_size=1, max_overflow=0, settings=settings)
    engine = create_engine(dsn, settings=settings)
    try:
        upgrade(engine)
        run(traced, engine, dsn, args)
    finally:
        traced.dispose()
        engine.dispose()
        harness.drop_database(url, args.database)
    return 0


def only(dsn: str, args: argparse.Namespace) -> int:
    """Run one of :func:`one_row`'s variants ``--calls`` times, after its set-up."""
    engine = create_engine(dsn, pool_size=1, max_overflow=0)
    with Session(engine) as session:
        call = list(one_row(session).values())[ONE_ROW[args.only]]
        for _ in range(args.calls):
            call()
        session.rollback()
    engine.dispose()
    return 0


def instructions(args: argparse.Namespace) -> None:
    """Instructions per call of (b) and the raw INSERTs, counted by callgrind."""
    print(f"user-space instructions per call (callgrind; {args.calls} and {10 * args.calls} calls)")
    per_call: dict[str, float] = {}
    for name in ONE_ROW:
        counts = [_callgrind(name, calls, args) for calls in (args.calls, 10 * args.calls)]
        per_call[name] = (counts[1] - counts[0]) / (9 * args.calls)
    labels = {"b": "(b) enqueue in an open transaction", "execute": "raw, conn.execute"}
    labels["cursor"] = "raw, cursor kept"
    for name, value in per_call.items():
        ratios = f"  {value / per_call['execute']:.2f}x / {value / per_call['cursor']:.2f}x"
        print(f"  {labels[name]:40} {value / 1000:8.1f} k{ratios if name == 'b' else ''}")
    print("  (ratios: to the raw INSERT by conn.execute / with a cursor kept)")


def _callgrind(name: str, calls: int, args: argparse.Namespace) -> int:
    """Instructions of one ``--only name`` process under callgrind."""
    with tempfile.TemporaryDirectory() as directory:
        out = Path(directory) / "callgrind.out"
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
        command += [sys.executable, __file__, "--only", name, "--calls", str(calls)]
        command += ["--database", args.database]
        # A fixed hash seed: the same dict and set layouts in every run.
        environment = os.environ | {"PYTHONHASHSEED": "0"}
        subprocess.run(command, check=True, capture_output=True, env=environment)
        for line in out.read_text().splitlines():
            if line.startswith("summary:"):
                return int(line.split()[1])
    raise RuntimeError("callgrind wrote no summary")


def run(traced: sa.Engine, engine: sa.Engine, dsn: str, args: argparse.Namespace) -> None:
    task = queue.get_task("noop")
    sizes = [int(size) for size in args.sizes.split(",")]
    with traced.connect() as conn:
        trace = Trace(conn.connection.driver_connection.pgconn)  # type: ignore[union-attr]

    def shape_a(engine: sa.Engine = engine) -> None:
        with Session(engine) as session, session.begin():
            queue.enqueue(session, task, {"n": 1})

    def many(size: int, engine: sa.Engine = engine) -> Callable[[], None]:
        payloads = [{"n": n} for n in range(size)]

        def call() -> None:
            with Session(engine) as session, session.begin():
                queue.enqueue_many(session, task, payloads)

        return call

    print("1. round trips per call")
    for _ in range(6):  # psycopg prepares a statement at its 5th run: past that first
        shape_a(traced)
    print(f"  (a) Session, enqueue, commit: {trace.round_trips(lambda: shape_a(traced)):.2f}")
    with Session(traced) as session:
        session.execute(sa.text("SELECT 1"))
        for _ in range(6):  # past psycopg's preparing of the statement that wakes no queue
            queue.enqueue(session, task, {"n": 1})
        print(
            "  (b) enqueue in an open transaction:"
            f" {trace.round_trips(lambda: queue.enqueue(session, task, {'n': 1})):.2f}"
        )
        session.rollback()
    for size in sizes:
        call = many(size, traced)
        call()
        print(f"  (c) enqueue_many({size}), commit: {trace.round_trips(call, times=3):.2f}")

    print("\n2. client CPU per call")
    statement = enqueue_sql.insert_job("now", True)
    compiled = statement.compile(dialect=engine.dialect)
    values = compiled.construct_params(
        {"queue": "bench", "task": "noop", "payload": '{"n":1}', "priority": 0}
        | {"max_attempts": 5, "lease": 30.0}
    )
    with psycopg.connect(dsn, options=f"-c synchronous_commit={args.sync_commit}") as raw:

        def psycopg_alone() -> None:
            raw.execute(compiled.string, values).fetchone()
            raw.commit()

        with Session(engine) as session:
            medians = alternate(
                {
                    "(a) Session, enqueue, commit": shape_a,
                    "the same INSERT and COMMIT with psycopg alone": psycopg_alone,
                }
                | one_row(session),
                args.calls,
                args.rounds,
            )
            session.rollback()
        b = medians["(b) enqueue in an open transaction"]
        print(
            f"  (b) / raw INSERT: {b / medians['raw psycopg INSERT, conn.execute']:.2f}x"
            f" (conn.execute), {b / medians['raw psycopg INSERT, cursor kept']:.2f}x (cursor kept)"
        )

    print("\n3. enqueue_many by INSERT and by COPY, per job")
    default = inserting.COPY_FROM
    try:
        for size in sizes:
            results: dict[str, tuple[list[float], list[float]]] = {}
            call = many(size)
            repeat = max(1, 20_000 // size)
            for _ in range(args.rounds):
                for path, threshold in (("INSERT", 10**12), ("COPY", 1)):
                    inserting.COPY_FROM = threshold
                    call()
                    c0, w0 = time.process_time(), time.perf_counter()
                    for _ in range(repeat):
                        call()
                    jobs = size * repeat
                    wall, cpu = results.setdefault(path, ([], []))
                    wall.append((time.perf_counter() - w0) / jobs * 1e6)
                    cpu.append((time.process_time() - c0) / jobs * 1e6)
            line = "  ".join(
                f"{path} wall {statistics.median(wall):6.2f} µs, CPU"
                f" {statistics.median(cpu):6.2f} µs"
                for path, (wall, cpu) in results.items()
            )
            print(f"  {size:6} jobs: {line}")
    finally:
        inserting.COPY_FROM = default


if __name__ == "__main__":
    sys.exit(main())
