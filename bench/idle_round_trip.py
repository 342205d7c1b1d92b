"""What one round trip costs right after a connection sat idle: the floor under pickup latency.

    bench/.venv/bin/python bench/idle_round_trip.py [--calls N] [--idle SECONDS]

Uses $DATABASE_URL's server (a database ``bench_idle_round_trip`` is created and dropped).
An idle worker picks up a job with one statement, its claim, sent as soon as the NOTIFY
arrives. This times, in wall-clock milliseconds (medians and 95th percentiles over ``--calls``
calls), three statements each sent once right after the previous one (hot) and once after
the connection sat idle for ``--idle`` seconds (the latency scenario enqueues 20 jobs a
second, so 0.05):

- ``SELECT 1`` on a psycopg connection;
- the worker's claim of one job just enqueued, on a psycopg connection (its driver text);
- the same claim as the worker sends it (``HeldConnection.rows``, with its deadline).

Variants alternate call by call, so a change of the machine's speed falls on each alike.
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

import psycopg  # noqa: E402
import sqlalchemy as sa  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from bench import harness  # noqa: E402
from sa_jobqueue import JobContext, JobQueue  # noqa: E402
from sa_jobqueue._deadlines import DEADLINES, StopClock, guard_statements  # noqa: E402
from sa_jobqueue._sql import claiming  # noqa: E402
from sa_jobqueue.database import (  # noqa: E402
    HeldConnection,
    _as_text,
    create_control_engine,
    create_engine,
)
from sa_jobqueue.migrations import upgrade  # noqa: E402

DATABASE = "bench_idle_round_trip"
queue = JobQueue()


@queue.task
def noop(ctx: JobContext, payload: Any) -> None:
    """Never run: its jobs are only enqueued and claimed."""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=300, help="calls per variant and gap")
    p.add_argument("--idle", type=float, default=0.05, help="the idle gap (seconds)")
    args = p.parse_args()
    with harness.scratch_database(DATABASE) as dsn:
        engine = create_engine(dsn)
        control = create_control_engine(dsn, 1)
        upgrade(engine)
        # As a worker's own statements run: each under a client-side deadline, which its
        # stop would hurry.
        clock = StopClock()
        guard_statements(control, clock=clock)
        held = HeldConnection(control)
        raw = psycopg.connect(harness.plain_url(dsn), autocommit=True)
        params = {"from_queue": "default", "limit": 1, "worker": "bench"}
        with control.connect() as conn:
            text = _as_text(conn, claiming.claim())
        assert text is not None
        values = {**text.constants, **params}
        by_position = tuple(values[name] for name in text.names)

        def enqueue() -> None:
            with Session(engine) as session, session.begin():
                queue.enqueue(session, noop, {})

        def raw_claim() -> None:
            assert len(raw.execute(text.text, by_position).fetchall()) == 1

        def worker_claim() -> None:
            assert len(held.rows(claiming.claim(), params, as_text=True)) == 1

        kept = control.connect()
        driver: Any = kept.connection.driver_connection

        def driver_claim() -> None:
            with DEADLINES.guard(driver, clock=clock):
                assert len(driver.execute(text.text, by_position).fetchall()) == 1

        def nothing() -> None:
            pass

        # name: (what comes before the statement, the same connection answering a statement,
        # the statement timed)
        variants: dict[str, tuple[Callable[[], None], Callable[[], None], Callable[[], None]]] = {
            "SELECT 1, psycopg": (nothing, nothing, lambda: raw.execute("SELECT 1").fetchall()),
            "claim of one job, psycopg": (enqueue, lambda: raw.execute("SELECT 1"), raw_claim),
            "claim of one job, as the worker sends it": (
                enqueue,
                lambda: held.rows(sa.select(sa.literal(1)), {}),
                worker_claim,
            ),
            "claim of one job, driver with deadline": (
                enqueue,
                lambda: driver.execute("SELECT 1"),
                driver_claim,
            ),
        }
        gaps = {"hot": 0.0, f"after {args.idle * 1000:g} ms idle": args.idle}
        samples: dict[tuple[str, str], list[float]] = {}
        for call in range(args.calls + 10):  # the first 10 warm up (prepared statements)
            for gap_name, gap in gaps.items():
                for name, (before, warm, statement) in variants.items():
                    if gap:
                        time.sleep(gap)  # as an idle worker's claim connection sits
                        before()  # the job is enqueued; the claim goes at once
                    else:
                        before()
                        warm()  # the connection has just answered
                    started = time.perf_counter()
                    statement()
                    spent = time.perf_counter() - started
                    if call >= 10:
                        samples.setdefault((name, gap_name), []).append(spent * 1000)
        held.close()
        kept.close()
        raw.close()
        engine.dispose()
        control.dispose()
    print(f"wall-clock ms per statement, {args.calls} calls each")
    print(f"  {'statement':<42} {'when':<20} {'p50':>6} {'p95':>6}")
    for (name, gap_name), values in samples.items():
        values.sort()
        p95 = values[int(len(values) * 0.95)]
        print(f"  {name:<42} {gap_name:<20} {statistics.median(values):6.3f} {p95:6.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
