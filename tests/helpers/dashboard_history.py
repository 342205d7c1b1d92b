"""A jobs table with a long finished history, for the dashboard's plans and page timings.

:func:`fill` writes it in two ``INSERT ... SELECT generate_series`` statements: finished jobs
a ``spacing`` apart up to now (96% succeeded, 3% dead, 1% cancelled, in three queues and ten
tasks), then a backlog of queued and running jobs. :data:`PAGES` are the dashboard's pages as
the plan test and the timings visit them.

Run as a program, it measures each page on a scratch database it creates and drops
(``sajq_dashboard_timings``) and prints a Markdown table of timings, then every statement the
pages send with its ``EXPLAIN (ANALYZE, BUFFERS)``::

    python -m tests.helpers.dashboard_history --database-url postgresql://postgres@localhost/postgres
"""

from __future__ import annotations

import argparse
import os
import statistics
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL

JOBS = "sa_jobqueue_jobs"

_FINISHED = sa.text(
    """
INSERT INTO sa_jobqueue_jobs (queue, task, payload, status, attempts, visible_at, created_at,
                              started_at, finished_at, last_error)
-- The three queues the pages name, then queue_3, queue_4 and so on.
SELECT (CASE WHEN mod(n, :queues) < 3
       THEN (ARRAY['default', 'emails', 'reports'])[1 + mod(n, :queues)]
       ELSE 'queue_' || mod(n, :queues) END), 'app.task_' || mod(n, 10),
       jsonb_build_object('n', n, 'note', 'a payload of a few dozen bytes'),
       CASE WHEN mod(n, 100) < 96 THEN 'succeeded'
            WHEN mod(n, 100) < 99 THEN 'dead' ELSE 'cancelled' END,
       1, at, at - interval '2 s', at - interval '1 s', at,
       CASE WHEN mod(n, 100) BETWEEN 96 AND 98
            THEN jsonb_build_object('type', 'ValueError', 'message', 'bad input ' || n,
                                    'traceback', 'Traceback (most recent call last): ...') END
FROM generate_series(1, :finished) AS n,
     LATERAL (SELECT now() - (:finished - n) * make_interval(secs => :spacing) AS at) AS t
"""
)
_BACKLOG = sa.text(
    """
INSERT INTO sa_jobqueue_jobs (queue, task, payload, status, attempts, started_at, visible_at)
-- The three queues the pages name, then queue_3, queue_4 and so on.
SELECT (CASE WHEN mod(n, :queues) < 3
       THEN (ARRAY['default', 'emails', 'reports'])[1 + mod(n, :queues)]
       ELSE 'queue_' || mod(n, :queues) END), 'app.task_' || mod(n, 10),
       jsonb_build_object('n', n),
       CASE WHEN mod(n, 20) = 0 THEN 'running' ELSE 'queued' END,
       CASE WHEN mod(n, 20) = 0 THEN 1 ELSE 0 END,
       CASE WHEN mod(n, 20) = 0 THEN now() END,
       now() + (mod(n, 7) - 3) * interval '1 minute'
FROM generate_series(1, :backlog) AS n
"""
)

#: The pages visited: {mid} is a job id in the middle of the history, {dead} a dead job's id.
PAGES = [
    "/",
    "/?queues_after=queue_5000",
    "/jobs",
    "/jobs?after={mid}",
    "/jobs?before={mid}",
    "/jobs?order=oldest&after={mid}",
    "/jobs?status=dead",
    "/jobs?status=dead&queue=emails&after={mid}",
    "/jobs?status=dead&order=oldest",
    "/jobs?status=queued&status=running&order=oldest",
    "/jobs?status=queued&queue=reports",
    "/jobs?queue=emails",
    "/jobs?queue=queue_1234",
    "/jobs?status=succeeded&task=app.task_3",
    "/jobs?task=app.no_such_task",
    "/jobs?older_than=2h",
    "/jobs?older_than=1d",
    "/jobs?older_than=1d&order=oldest",
    "/jobs?order=oldest",
    "/jobs?queue=emails&order=oldest",
    "/jobs?status=succeeded&order=oldest",
    "/jobs?status=queued&order=oldest",
    "/jobs?status=queued&order=oldest&limit=10",
    "/jobs?status=running&order=oldest",
    "/jobs?status=queued&queue=reports&order=oldest",
    "/jobs?status=dead&queue=emails&order=oldest",
    "/jobs?status=cancelled",
    "/jobs?status=waiting",
    '/jobs?payload={{"n": 12345}}',
    '/jobs?status=dead&payload={{"note": "no such note"}}',
    "/jobs/{dead}",
    "/jobs/{dead}/payload.json",
    "/jobs/{chord}",
    "/jobs/{chord}/workflow",
    "/jobs/{member}/workflow",
    "/workflows/{workflow}",
    "/queues?name=emails",
    "/periodic",
    "/purge?status=dead&older_than=1h",
    "/purge?status=succeeded&status=cancelled&older_than=10h",
    "/purge?status=succeeded&status=dead&older_than=1h",
]


#: The members of the chord in the history: more than a job page lists, or a workflow view draws.
CHORD = 1_000

_CHORD = sa.text(
    """
INSERT INTO sa_jobqueue_dependencies (job_id, depends_on, on_failure, pending)
SELECT :chord, :chord - n, 'cancel', false FROM generate_series(1, :members) AS n
"""
)
#: Chains of two among the oldest half of the history (each even id waited for the id before
#: it): edges enough that the pages' reads of them have an index to use, as they would.
_PAIRS = sa.text(
    """
INSERT INTO sa_jobqueue_dependencies (job_id, depends_on, on_failure, pending)
SELECT k, k - 1, 'cancel', false FROM generate_series(:first + 2, :last, 2) AS k
"""
)


_WORKFLOW = sa.text("UPDATE sa_jobqueue_jobs SET workflow_id = 1 WHERE id BETWEEN :first AND :last")


def fill(
    engine: sa.Engine,
    finished: int,
    backlog: int = 200,
    spacing: float = 1.0,
    queues: int = 3,
) -> dict[str, int]:
    """Write the history and the backlog, then VACUUM ANALYZE; the ids :data:`PAGES` need.

    ``spacing`` seconds apart, the history spans ``finished * spacing`` seconds up to now;
    its jobs (and the backlog's) go round ``queues`` queues.
    """
    with engine.begin() as conn:
        conn.execute(_FINISHED, {"finished": finished, "spacing": spacing, "queues": queues})
        conn.execute(_BACKLOG, {"backlog": backlog, "queues": queues})
        jobs = sa.table(JOBS, sa.column("id"), sa.column("status"))
        dead = conn.execute(
            sa.select(sa.func.max(jobs.c.id)).where(jobs.c.status == "dead")
        ).scalar_one()
        first = conn.execute(sa.select(sa.func.min(jobs.c.id))).scalar_one()
        # A chord in the history: CHORD jobs before the middle one, which waited for them all.
        chord = first + finished // 2
        members = min(CHORD, finished // 2)
        conn.execute(_CHORD, {"chord": chord, "members": members})
        conn.execute(_PAIRS, {"first": first, "last": chord - members - 1})
        # The chord is a workflow too (as queue.chord makes it), with its own page.
        conn.execute(_WORKFLOW, {"first": chord - members, "last": chord})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM ANALYZE sa_jobqueue_jobs"))
        conn.execute(sa.text("VACUUM ANALYZE sa_jobqueue_dependencies"))
    return {"mid": chord, "dead": dead, "chord": chord, "member": chord - 1, "workflow": 1}


@contextmanager
def recording(engine: sa.Engine) -> Iterator[list[tuple[str, Any]]]:
    """Every statement ``engine`` sends in the block, with its parameters."""
    statements: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        statements.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield statements
    finally:
        event.remove(engine, "before_cursor_execute", record)


@contextmanager
def timing(engine: sa.Engine) -> Iterator[list[float]]:
    """The seconds each statement ``engine`` runs in the block takes, round trip included."""
    spent: list[float] = []

    def before(
        conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, *_: Any
    ) -> None:
        context._sajq_started = time.perf_counter()

    def after(
        conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, *_: Any
    ) -> None:
        spent.append(time.perf_counter() - context._sajq_started)

    event.listen(engine, "before_cursor_execute", before)
    event.listen(engine, "after_cursor_execute", after)
    try:
        yield spent
    finally:
        event.remove(engine, "before_cursor_execute", before)
        event.remove(engine, "after_cursor_execute", after)


def reads_jobs(statement: str) -> bool:
    """Whether a recorded statement is a read of the jobs table (not a setting or a catalog)."""
    return JOBS in statement and statement.lstrip().upper().startswith(("SELECT", "WITH"))


# -- timings ---------------------------------------------------------------------------------

PAGE_NAMES = {
    "/": "Overview",
    "/?queues_after=queue_5000": "Overview, the queues after queue_5000",
    "/periodic": "Periodic schedules",
    "/jobs/{dead}": "A job",
    "/jobs/{dead}/payload.json": "A job's payload",
    "/jobs/{chord}": "A chord's callback (1,000 dependencies)",
    "/jobs/{chord}/workflow": "The workflow view of a chord of 1,000",
    "/queues?name=emails": "A queue's page (its last hour, day and week)",
}


def _measure(
    url: URL,
    finished: int,
    rounds: int,
    *,
    backlog: int,
    queues: int,
    spacing: float,
    also_queues: int | None = None,
) -> None:
    load = os.getloadavg()[0]
    with _filled(url, finished, backlog, queues, spacing) as (engine, ids, filled):
        with engine.connect() as conn:
            version = conn.execute(sa.text("SHOW server_version")).scalar_one()
            size = conn.execute(
                sa.text("SELECT pg_size_pretty(pg_total_relation_size('sa_jobqueue_jobs'))")
            ).scalar_one()
            counts = dict(
                conn.execute(
                    sa.text("SELECT status, count(*) FROM sa_jobqueue_jobs GROUP BY status")
                ).all()
            )
        rows, plans = _time_pages(engine, ids, rounds)
        more: list[str] = []
        if also_queues:
            with _filled(url, finished, backlog, also_queues, spacing) as (other, other_ids, _):
                more, _ = _time_pages(other, other_ids, rounds)
        spread = finished * spacing / 86_400
        shape = (version, size, counts, queues, spread, filled)
        _page(shape, rounds, rows, (load, os.getloadavg()[0]), (also_queues, more))
        with engine.connect() as conn:
            # As the pages run them: page_settings() asks for no parallel workers.
            conn.execute(sa.text("SET max_parallel_workers_per_gather = 0"))
            for page, statements in plans.items():
                kind = "Jobs list" if page.startswith("/jobs") else "Purge form"
                print(f"\n### {PAGE_NAMES.get(page, kind)}: `{as_shown(page)}`\n")
                for statement, parameters in statements:
                    lines = conn.exec_driver_sql(
                        "EXPLAIN (ANALYZE, COSTS OFF) " + statement, parameters
                    ).scalars()
                    shown = {
                        k: v for k, v in parameters.items() if not k.startswith("make_interval")
                    }
                    print("```text\n" + _wrapped(statement))
                    print(f"-- parameters: {shown}")
                    print("\n".join(lines) + "\n```")
            _explain_fold(conn)


@contextmanager
def _filled(
    url: URL, finished: int, backlog: int, queues: int, spacing: float
) -> Iterator[tuple[sa.Engine, dict[str, int], float]]:
    """A scratch database with the history in it: its engine, the pages' ids, seconds taken."""
    from sa_jobqueue.database import create_engine
    from sa_jobqueue.migrations import upgrade
    from tests.helpers.databases import drop_database, recreate_database

    name = f"sajq_dashboard_timings_{queues}"
    engine = create_engine(recreate_database(url, name))
    try:
        upgrade(engine)
        started = time.perf_counter()
        ids = fill(engine, finished, backlog, spacing, queues)
        yield engine, ids, time.perf_counter() - started
    finally:
        engine.dispose()
        drop_database(url, name)


def _time_pages(
    engine: sa.Engine, ids: dict[str, int], rounds: int
) -> tuple[list[str], dict[str, list[tuple[str, Any]]]]:
    """Each page's row of the timings table, and the reads of the jobs table it sends."""
    from starlette.testclient import TestClient

    from sa_jobqueue.web import create_app
    from tests.helpers.pages import LOCAL

    rows: list[str] = []
    plans: dict[str, list[tuple[str, Any]]] = {}
    with TestClient(create_app(engine), base_url=LOCAL) as client:
        for page in PAGES:
            path = page.format(**ids)
            began = time.perf_counter()
            assert client.get(path).status_code == 200, path
            cold = (time.perf_counter() - began) * 1000
            with recording(engine) as sent:
                client.get(path)
            plans[page] = [(s, p) for s, p in sent if reads_jobs(s)]
            times, database = [], []
            for _ in range(rounds):
                with timing(engine) as spent:
                    began = time.perf_counter()
                    client.get(path)
                    times.append((time.perf_counter() - began) * 1000)
                database.append(sum(spent) * 1000)
            p90 = statistics.quantiles(times, n=10)[-1]
            rows.append(
                f"| `{as_shown(page)}` | {len(sent)} | {statistics.median(times):.1f} ms"
                f" | {p90:.1f} ms | {statistics.median(database):.1f} ms | {cold:.1f} ms |"
            )
    return rows, plans


def as_shown(page: str) -> str:
    """A page of :data:`PAGES` as the reference shows it: its JSON's braces single again."""
    return page.replace("{{", "{").replace("}}", "}")


def fold_bounds(conn: sa.Connection) -> dict[str, Any]:
    """The window of the history's fold over the hour that ended an hour ago."""
    since, until = conn.execute(
        sa.text("SELECT now() - interval '2 hours', now() - interval '1 hour'")
    ).one()
    return {"since": since, "until": until}


def _explain_fold(conn: sa.Connection) -> None:
    """The history's fold over one hour of finishes, as the workers' upkeep runs it."""
    from sa_jobqueue._sql import history

    statement = history.fold().compile(dialect=conn.dialect)
    params = statement.construct_params(fold_bounds(conn))
    lines = list(
        conn.exec_driver_sql("EXPLAIN (ANALYZE, COSTS OFF) " + statement.string, params).scalars()
    )
    conn.rollback()
    print("\n## The history's fold\n")
    print(
        "What a worker's upkeep runs about once a minute (never on the completion path): the"
        " finishes of one window of `finished_at` (here the hour that ended an hour ago) added"
        " to the hourly history, rolled back after the EXPLAIN. It reads the window from the"
        " prune and dead indexes, nothing else of the table.\n"
    )
    print("```text\n" + _wrapped(statement.string))
    print(f"-- parameters: {params}")
    print("\n".join(lines) + "\n```")


def _wrapped(statement: str) -> str:
    """The statement's lines, each folded at 100 characters (a SELECT list runs long)."""
    return "\n".join(
        textwrap.fill(line, 100, subsequent_indent="    ", break_long_words=False)
        for line in statement.strip().splitlines()
    )


def _page(
    shape: tuple[str, str, dict[str, int], int, float, float],
    rounds: int,
    rows: list[str],
    load: tuple[float, float],
    also: tuple[int | None, list[str]] = (None, []),
) -> None:
    version, size, counts, queues, spread, filled = shape
    done = ("succeeded", "dead", "cancelled")
    finished = sum(counts.get(s, 0) for s in done)
    described = ", ".join(f"{counts.get(s, 0):,} {s}" for s in done)
    live = counts.get("queued", 0) + counts.get("running", 0)
    print(f"""# Dashboard queries and their plans

What each page of the [dashboard](../how-to/dashboard.md) sends to PostgreSQL, and how the
server runs it on a jobs table of {finished:,} finished jobs ({described}),
created over {spread:.1f} days, and {live:,} queued or running, in {queues:,} queues and ten
tasks, {size} with its indexes, written in {filled:.0f} s by
`INSERT ... SELECT generate_series` into a scratch database that the command creates and
drops:

```sh
python -m tests.helpers.dashboard_history \\
    --database-url postgresql://postgres@127.0.0.1:5432/postgres --also-queues 10000 \\
    > docs/reference/dashboard-queries.md
```

PostgreSQL {version.split()[0]}, on two CPU cores shared with other work (load average
{load[0]:.1f} when the timings began, {load[1]:.1f} when they ended). Every read of the
jobs table goes through an index and looks at a bounded part of it: a test,
`tests/acceptance/test_web_plans.py`, runs each one under `EXPLAIN ANALYZE` on a smaller
history and fails on a scan of the table, or on a statement that looks at more rows than a
window of ids or one click's batch.

## Page timings

Each page through Starlette's TestClient (no network), read-only, {rounds} requests after a
first one: the median and 90th percentile of the whole request, the median of the time in
its statements (round trips included; the rest is Python: the app, the templates), and the
first request ("cold": templates compiled, plans made). "Statements" counts all a page
sends, the transaction's settings and the health checks' catalog reads included.

| page | statements | median | p90 | of which statements | cold |
|---|---:|---:|---:|---:|---:|""")
    print("\n".join(rows))
    also_queues, more = also
    if also_queues:
        print(f"""
### The same history in {also_queues:,} queues

The same jobs spread over {also_queues:,} queues (`--also-queues {also_queues}`), the pages timed
the same way: the overview shows a hundred of them a page.

| page | statements | median | p90 | of which statements | cold |
|---|---:|---:|---:|---:|---:|""")
        print("\n".join(more))
    print("""
## Statements and plans

Each statement that reads the jobs table, as sent, with `EXPLAIN (ANALYZE, COSTS OFF)`.
The overview's other statements read the workers table (a row per worker process) and
PostgreSQL's statistics views.""")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--database-url", required=True, help="a server to create a database on")
    parser.add_argument("--rows", type=int, default=1_000_000, help="finished jobs (1,000,000)")
    parser.add_argument("--backlog", type=int, default=20_000, help="queued/running (20,000)")
    parser.add_argument("--queues", type=int, default=3, help="queues the jobs go round (3)")
    parser.add_argument(
        "--spacing", type=float, default=0.7, help="seconds between finished jobs (0.7)"
    )
    parser.add_argument("--rounds", type=int, default=20, help="requests timed per page (20)")
    parser.add_argument(
        "--also-queues", type=int, help="time the pages again with the jobs in this many queues"
    )
    args = parser.parse_args()
    from sa_jobqueue.database import normalise_url

    _measure(
        normalise_url(args.database_url),
        args.rows,
        args.rounds,
        backlog=args.backlog,
        queues=args.queues,
        spacing=args.spacing,
        also_queues=args.also_queues,
    )


if __name__ == "__main__":
    main()
