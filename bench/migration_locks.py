"""What each of our revisions locks, for how long, and how long it stalls a drain.

    .venv/bin/python bench/migration_locks.py [--database-url URL] [--rows 1000000]
        [--queued 50000] [--from sajq_0002] [--to heads]

One database (``bench_migration_locks``, created and dropped on the server of
``--database-url``, default ``DATABASE_URL`` or the benchmark cluster at 127.0.0.1:5433) is
brought to the revision before ``--from`` and filled with ``--rows`` jobs, ``--queued`` of
them queued and the rest finished (one ``generate_series`` INSERT). Two drain processes then
claim and complete jobs at full speed and one enqueues a job every 5 ms, while the database
is stepped one revision at a time up to ``--to``; before each step the queued jobs are topped
up to ``--queued``. A thread samples ``pg_locks`` joined with ``pg_stat_activity`` every
10 ms during each step.

For each revision it prints how long the upgrade took; each table lock the migration's
backend held or waited for (the strongest mode per table, and how long it was seen: from the
first sample to the last, so to within 10 ms); the most backends seen waiting for a lock at
once, and what they were running; the drain's stall (the longest gap between two completions,
from the step's start to half a second after its end) against the longest gap in the 1.5 s
before it; and the enqueues' stall, measured the same way.

The drain processes are not sa_jobqueue workers: a worker of this version refuses every
schema but the newest, and one of an older version needs that version's code. They send the
statements that matter to locks, in the worker's shape: a claim of up to 10 queued jobs of
one queue in claim order (``FOR UPDATE SKIP LOCKED``), then their completion by id, each in
a transaction of its own; the completion's ``finished_at`` is ``clock_timestamp()``, the
time it was written rather than the time its transaction began, so that a completion held up
by a lock shows the wait as a gap. The enqueuer's row takes ``created_at`` the same way.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic.script import ScriptDirectory
from sqlalchemy.engine import URL

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sa_jobqueue.database import create_engine, normalise_url  # noqa: E402
from sa_jobqueue.migrations import _locks, upgrade  # noqa: E402

DATABASE = "bench_migration_locks"
MIGRATOR = "sajq_migrate"
#: PostgreSQL's lock modes, weakest first (the "strongest mode" of a table is the last seen).
MODES = [
    "AccessShareLock",
    "RowShareLock",
    "RowExclusiveLock",
    "ShareUpdateExclusiveLock",
    "ShareLock",
    "ShareRowExclusiveLock",
    "ExclusiveLock",
    "AccessExclusiveLock",
]

FILL = sa.text(
    "INSERT INTO sa_jobqueue_jobs (task, payload, status, attempts, visible_at, created_at,"
    " started_at, finished_at)"
    " SELECT 'noop', jsonb_build_object('n', n), CASE WHEN n <= :queued THEN 'queued'"
    " ELSE 'succeeded' END, CASE WHEN n <= :queued THEN 0 ELSE 1 END, now(), now(),"
    " CASE WHEN n <= :queued THEN NULL ELSE now() - n * interval '1 second' END,"
    " CASE WHEN n <= :queued THEN NULL ELSE now() - n * interval '1 second' END"
    " FROM generate_series(1, :rows) AS n"
)
QUEUED = sa.text(
    "SELECT count(*) FROM sa_jobqueue_jobs WHERE status = 'queued' AND queue = 'default'"
)
TOP_UP = sa.text(
    "INSERT INTO sa_jobqueue_jobs (task, payload) SELECT 'noop', '{}' FROM generate_series(1, :n)"
)
CLAIM = sa.text(
    "UPDATE sa_jobqueue_jobs SET status = 'running', attempts = attempts + 1,"
    " started_at = now(), worker = 'drain'"
    " WHERE id IN (SELECT id FROM sa_jobqueue_jobs"
    "   WHERE status = 'queued' AND queue = 'default' AND visible_at <= now()"
    "   ORDER BY priority, visible_at, id LIMIT 10 FOR UPDATE SKIP LOCKED)"
    " RETURNING id"
)
COMPLETE = sa.text(
    "UPDATE sa_jobqueue_jobs SET status = 'succeeded', finished_at = clock_timestamp(),"
    " worker = NULL WHERE id = ANY(:ids) AND status = 'running'"
)
ENQUEUE = sa.text(
    "INSERT INTO sa_jobqueue_jobs (queue, task, payload, visible_at, created_at)"
    " VALUES ('enqueued', 'noop', '{}', now() + interval '1 day', clock_timestamp())"
)
#: The longest gap between consecutive completions (or enqueues) in [:since, :until], the
#: window's ends counted as events: a window with none at all is one whole gap.
COMPLETION_GAP = sa.text(
    "SELECT coalesce(extract(epoch FROM max(gap)), 0) FROM ("
    " SELECT t - lag(t) OVER (ORDER BY t) AS gap FROM ("
    "  SELECT finished_at AS t FROM sa_jobqueue_jobs WHERE queue = 'default'"
    "  AND status = 'succeeded' AND finished_at BETWEEN :since AND :until"
    "  UNION ALL SELECT CAST(:since AS timestamptz) UNION ALL SELECT CAST(:until AS timestamptz)"
    " ) AS e) AS g"
)
ENQUEUE_GAP = sa.text(
    "SELECT coalesce(extract(epoch FROM max(gap)), 0) FROM ("
    " SELECT t - lag(t) OVER (ORDER BY t) AS gap FROM ("
    "  SELECT created_at AS t FROM sa_jobqueue_jobs WHERE queue = 'enqueued'"
    "  AND created_at BETWEEN :since AND :until"
    "  UNION ALL SELECT CAST(:since AS timestamptz) UNION ALL SELECT CAST(:until AS timestamptz)"
    " ) AS e) AS g"
)
LOCKS = sa.text(
    "SELECT a.application_name = :migrator AS migrating, c.relname, l.mode, l.granted,"
    " left(regexp_replace(a.query, '\\s+', ' ', 'g'), 48) AS query"
    " FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
    " JOIN pg_class c ON c.oid = l.relation"
    " WHERE l.locktype = 'relation' AND l.database = (SELECT oid FROM pg_database"
    "   WHERE datname = current_database())"
    " AND c.relkind IN ('r', 'p') AND c.relname LIKE 'sa\\_jobqueue\\_%'"
    " AND a.pid <> pg_backend_pid()"
    " AND (a.application_name = :migrator OR NOT l.granted)"
)
NOW = sa.text("SELECT clock_timestamp()")


def drain(url: str) -> None:
    """A drain process: claim up to 10 jobs, complete them, for ever (until killed)."""
    engine = sa.create_engine(url, connect_args={"application_name": "drain"})
    while True:
        try:
            with engine.begin() as conn:
                ids = list(conn.execute(CLAIM).scalars())
            if ids:
                with engine.begin() as conn:
                    conn.execute(COMPLETE, {"ids": ids})
            else:
                time.sleep(0.005)
        except sa.exc.DBAPIError as exc:
            print(f"drain: {str(exc).splitlines()[0]}", file=sys.stderr, flush=True)
            time.sleep(0.05)


def enqueue(url: str) -> None:
    """The enqueuer: one job every 5 ms (in a queue no drain claims)."""
    engine = sa.create_engine(url, connect_args={"application_name": "enqueue"})
    while True:
        try:
            with engine.begin() as conn:
                conn.execute(ENQUEUE)
        except sa.exc.DBAPIError as exc:
            print(f"enqueue: {str(exc).splitlines()[0]}", file=sys.stderr, flush=True)
        time.sleep(0.005)


@dataclass
class Samples:
    """What the sampler saw during one step."""

    count: int = 0
    #: (table, mode, granted) of the migration's locks -> the times (monotonic) it was seen.
    held: dict[tuple[str, str, bool], list[float]] = field(
        default_factory=lambda: defaultdict(list)
    )
    #: The most other backends waiting at once, and what they ran then.
    most_waiting: int = 0
    waiting_queries: set[str] = field(default_factory=set)
    #: Samples with at least one other backend waiting for a lock.
    blocked: int = 0


def sample(engine: sa.Engine, stop: threading.Event, into: Samples) -> None:
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT")
        while not stop.is_set():
            seen_at = time.monotonic()
            rows = conn.execute(LOCKS, {"migrator": MIGRATOR}).all()
            waiting = [r for r in rows if not r.migrating and not r.granted]
            for r in rows:
                if r.migrating:
                    into.held[(r.relname, r.mode, r.granted)].append(seen_at)
            if waiting:
                into.blocked += 1
                if len(waiting) > into.most_waiting:
                    into.most_waiting = len(waiting)
                    into.waiting_queries = {f"{r.mode} on {r.relname}: {r.query}" for r in waiting}
            into.count += 1
            stop.wait(0.01)


def now(engine: sa.Engine) -> Any:
    with engine.connect() as conn:
        return conn.execute(NOW).scalar_one()


def gap(engine: sa.Engine, query: sa.TextClause, since: Any, until: Any) -> float:
    with engine.connect() as conn:
        return float(conn.execute(query, {"since": since, "until": until}).scalar_one())


def summary(samples: Samples) -> list[str]:
    """A line per table lock the migration held or waited for; seen for: from the first sample
    that showed it to the last, plus the 10 ms between samples."""
    lines = []
    by_table: dict[str, list[tuple[str, bool, list[float]]]] = defaultdict(list)
    for (table, mode, granted), seen in samples.held.items():
        by_table[table].append((mode, granted, seen))
    for table in sorted(by_table):
        for mode, granted, seen in sorted(by_table[table], key=lambda m: (MODES.index(m[0]), m[1])):
            span = seen[-1] - seen[0] + 0.01
            state = "held" if granted else "WAITED for"
            lines.append(f"    {state} {mode} on {table}: seen for {span:.2f} s")
    if not lines:
        lines.append("    no lock on a sa_jobqueue table seen (under 10 ms)")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--queued", type=int, default=50_000)
    parser.add_argument("--from", dest="first", default="sajq_0002")
    parser.add_argument("--to", default="heads")
    parser.add_argument("--drain", help=argparse.SUPPRESS)
    parser.add_argument("--enqueue", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.drain:
        drain(args.drain)
        return 0
    if args.enqueue:
        enqueue(args.enqueue)
        return 0

    server = normalise_url(args.database_url or "postgresql://postgres@127.0.0.1:5433/postgres")
    url: URL = server.set(database=DATABASE)
    script = ScriptDirectory(str(ROOT / "sa_jobqueue" / "migrations"))
    chain = [r.revision for r in reversed(list(script.walk_revisions()))]
    last = script.get_current_head() if args.to == "heads" else args.to
    steps = chain[chain.index(args.first) : chain.index(last) + 1]
    before = chain[chain.index(args.first) - 1]

    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)'))
        conn.execute(sa.text(f'CREATE DATABASE "{DATABASE}"'))
        version = conn.execute(sa.text("SHOW server_version")).scalar_one()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    print(f"$ {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(
        f"commit {commit}; PostgreSQL {version}; {platform.node()} ({os.cpu_count()} CPUs,"
        f" load {os.getloadavg()[0]:.2f}); lock_timeout {_locks.LOCK_TIMEOUT}"
    )

    migrator = create_engine(
        url, poolclass=sa.pool.NullPool, connect_args={"application_name": MIGRATOR}
    )
    engine = create_engine(url, poolclass=sa.pool.NullPool)
    processes: list[subprocess.Popen[bytes]] = []
    try:
        upgrade(migrator, before)
        started = time.monotonic()
        with engine.begin() as conn:
            conn.execute(FILL, {"rows": args.rows, "queued": args.queued})
        with engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").execute(
                sa.text("VACUUM ANALYZE sa_jobqueue_jobs")
            )
            size = conn.execute(
                sa.text("SELECT pg_size_pretty(pg_total_relation_size('sa_jobqueue_jobs'))")
            ).scalar_one()
        print(
            f"base: {args.rows:,} jobs ({args.queued:,} queued) at {before}, {size},"
            f" built in {time.monotonic() - started:.1f} s"
        )
        plain = url.render_as_string(hide_password=False).replace("+psycopg", "")
        me = [sys.executable, __file__]
        processes = [
            subprocess.Popen([*me, "--drain", plain]),
            subprocess.Popen([*me, "--drain", plain]),
            subprocess.Popen([*me, "--enqueue", plain]),
        ]
        time.sleep(2)  # the drains connect and reach full speed
        for revision in steps:
            with engine.begin() as conn:
                short = args.queued - conn.execute(QUEUED).scalar_one()
                if short > 0:
                    conn.execute(TOP_UP, {"n": short})
            calm_from = now(engine)
            time.sleep(1.5)
            samples = Samples()
            stop = threading.Event()
            sampler = threading.Thread(target=sample, args=(engine, stop, samples))
            sampler.start()
            since = now(engine)
            clock = time.monotonic()
            error = ""
            try:
                upgrade(migrator, revision)
            except Exception as exc:  # reported, and the run goes on with the next
                error = f" FAILED: {type(exc).__name__}: {str(exc).splitlines()[0]}"
            took = time.monotonic() - clock
            time.sleep(0.5)
            stop.set()
            sampler.join()
            after = now(engine)
            drain_calm = gap(engine, COMPLETION_GAP, calm_from, since)
            drain_stall = gap(engine, COMPLETION_GAP, since, after)
            enqueue_calm = gap(engine, ENQUEUE_GAP, calm_from, since)
            enqueue_stall = gap(engine, ENQUEUE_GAP, since, after)
            print(f"\n{revision}: upgrade took {took:.2f} s{error}")
            print("\n".join(summary(samples)))
            waiting = ", ".join(sorted(samples.waiting_queries)) or "none"
            print(
                f"    others waiting for a lock: at most {samples.most_waiting} at once,"
                f" in {samples.blocked} of {samples.count} samples ({waiting})"
            )
            print(
                f"    drain stall: {drain_stall:.3f} s (longest gap in the 1.5 s before:"
                f" {drain_calm:.3f} s)"
            )
            print(f"    enqueue stall: {enqueue_stall:.3f} s (before: {enqueue_calm:.3f} s)")
            sys.stdout.flush()
    finally:
        for proc in processes:
            proc.kill()
            proc.wait()
        migrator.dispose()
        engine.dispose()
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)'))
        admin.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
