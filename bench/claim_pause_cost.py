"""What the paused-queue probe adds to a claim: plans, buffers and server CPU per claim.

    bench/.venv/bin/python bench/claim_pause_cost.py [--backlog N] [--history N] [--claims N]

Uses $DATABASE_URL's server (a database ``bench_claim_pause`` is created and dropped) and fills
it with ``--history`` succeeded jobs and a ``--backlog`` of due ones in queue ``default``. Four
shapes of the claim, each taking 10 jobs in a transaction that is then rolled back (so every
claim sees the same backlog):

- ``without``: the claim with its paused-queue probe cut out (the statement before revision
  sajq_0007);
- ``no row``: today's claim, the queue without a row in ``sa_jobqueue_queues``;
- ``running``: today's claim, the queue with a row that is not paused;
- ``paused``: today's claim on a paused queue (it claims nothing).

Prints the compiled SQL, ``EXPLAIN (ANALYZE, BUFFERS)`` of each shape, and the server
backend's CPU per claim (``/proc/<backend pid>/schedstat``, nanoseconds on a CPU, so the server
must run on this machine), rounds alternating between the shapes, medians.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if sys.path and Path(sys.path[0]).resolve() == ROOT / "bench":
    sys.path[0] = str(ROOT)

import psycopg  # noqa: E402
from sqlalchemy.dialects.postgresql import psycopg as psycopg_dialect  # noqa: E402

from bench import harness  # noqa: E402
from sa_jobqueue._sql.claiming import claim  # noqa: E402
from sa_jobqueue.database import create_engine  # noqa: E402
from sa_jobqueue.migrations import upgrade  # noqa: E402

DATABASE = "bench_claim_pause"
PARAMS = {"from_queue": "default", "limit": 10, "worker": "bench"}
#: The probe as the claim compiles it, cut out for the ``without`` shape.
PROBE = re.compile(r" AND NOT \(EXISTS \(SELECT \* \nFROM sa_jobqueue_queues \nWHERE .*?\)\)", re.S)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backlog", type=int, default=100_000, help="due jobs in the queue")
    p.add_argument("--history", type=int, default=500_000, help="succeeded jobs")
    p.add_argument("--claims", type=int, default=1000, help="claims per CPU round")
    p.add_argument("--rounds", type=int, default=15, help="CPU rounds per shape")
    p.add_argument(
        "--plan-cache-mode",
        choices=("auto", "force_generic_plan", "force_custom_plan"),
        default="auto",
        help="PostgreSQL's plan_cache_mode for the prepared claims (default auto, as workers)",
    )
    return p.parse_args()


def statements() -> tuple[str, str, dict[str, Any]]:
    """The claim's SQL with psycopg's placeholders, without and with the probe, and values."""
    compiled = claim().compile(dialect=psycopg_dialect.dialect())
    with_probe = str(compiled)
    without = PROBE.sub("", with_probe)
    assert without != with_probe, "the probe was not found in the compiled claim"
    return without, with_probe, compiled.construct_params(PARAMS)


def fill(dsn: str, backlog: int, history: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO sa_jobqueue_jobs (queue, task, payload, status, attempts, started_at,"
            " finished_at) SELECT 'default', 'work', '{}', 'succeeded', 1, now(), now()"
            " FROM generate_series(1, %s)",
            (history,),
        )
        conn.execute(
            "INSERT INTO sa_jobqueue_jobs (queue, task, payload, visible_at)"
            " SELECT 'default', 'work', jsonb_build_object('n', n), now() - interval '1 minute'"
            " FROM generate_series(1, %s) AS n",
            (backlog,),
        )
        conn.execute("VACUUM ANALYZE")


def set_state(conn: psycopg.Connection[Any], state: str) -> None:
    # TRUNCATE, not DELETE: the rounds would otherwise pile dead row versions into the table.
    conn.execute("TRUNCATE sa_jobqueue_queues")
    if state in ("running", "paused"):
        conn.execute(
            "INSERT INTO sa_jobqueue_queues (queue, paused_at) VALUES ('default', %s)",
            (None if state == "running" else "now",),
        )
    conn.commit()


SHAPES = ("without", "no row", "running", "paused")


def on_cpu_ns(pid: int) -> int:
    """Nanoseconds process ``pid`` has spent on a CPU (the first field of its schedstat)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def main() -> int:
    args = parse_args()
    url = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    dsn = harness.recreate_database(url, DATABASE)
    try:
        engine = create_engine(dsn)
        upgrade(engine)
        engine.dispose()
        fill(dsn, args.backlog, args.history)
        run(dsn, args)
    finally:
        harness.drop_database(url, DATABASE)
    return 0


def run(dsn: str, args: argparse.Namespace) -> None:
    without, with_probe, values = statements()
    print("-- the claim (psycopg placeholders):\n" + with_probe + "\n")
    with psycopg.connect(dsn) as conn:
        for shape in SHAPES:
            set_state(conn, shape)
            sql = without if shape == "without" else with_probe
            plan = conn.execute(b"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql.encode(), values)
            print(f"-- {shape}:")
            print("\n".join(row[0] for row in plan))
            conn.rollback()
            print()
        conn.execute("SELECT set_config('plan_cache_mode', %s, false)", (args.plan_cache_mode,))
        conn.commit()
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert pid is not None
        per_claim: dict[str, list[float]] = {shape: [] for shape in SHAPES}
        for _ in range(args.rounds):
            for shape in SHAPES:
                set_state(conn, shape)
                sql = without if shape == "without" else with_probe
                for _ in range(20):  # warm: psycopg prepares a statement on its 5th run
                    conn.execute(sql, values, prepare=True)
                    conn.rollback()
                before = on_cpu_ns(pid[0])
                for _ in range(args.claims):
                    conn.execute(sql, values, prepare=True)
                    conn.rollback()
                per_claim[shape].append((on_cpu_ns(pid[0]) - before) / args.claims / 1000)
    print(
        f"server CPU per claim of 10 (and its rollback), plan_cache_mode {args.plan_cache_mode},"
        f" median of {args.rounds} rounds:"
    )
    for shape in SHAPES:
        values_ = sorted(per_claim[shape])
        quartiles = statistics.quantiles(values_, n=4)
        print(
            f"  {shape:8} {statistics.median(values_):7.1f} µs"
            f"   (quartiles {quartiles[0]:.1f} to {quartiles[2]:.1f})"
        )


if __name__ == "__main__":
    sys.exit(main())
