"""``sa-jobqueue stats``: jobs per queue and status, backlog age, run times, live workers.

Three tables (queues, task run times, live workers) or one JSON object, once or, with
``--watch``, again every so often until Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import Engine

from ..models import FINISHED_STATUSES, STATUSES
from ..ops import stats
from ..ops.health import span
from ..ops.stats import Stats
from . import _values
from ._output import table, to_json
from ._queues import rate_cell


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    database_option: Callable[[argparse.ArgumentParser], None],
) -> None:
    """Declare ``sa-jobqueue stats`` and its options."""
    stats_ = commands.add_parser(
        "stats", help="jobs per queue and status, backlog age, run times, live workers"
    )
    database_option(stats_)
    stats_.add_argument("--json", action="store_true", help="JSON instead of tables")
    stats_.add_argument(
        "--watch",
        type=_values.seconds,
        metavar="SECONDS",
        help="print again every SECONDS until Ctrl-C",
    )
    stats_.add_argument(
        "--window",
        type=_values.duration,
        default=timedelta(minutes=10),
        metavar="DURATION",
        help="how far back finished jobs and run times are counted (default 10m)",
    )


def run(engine: Engine, args: argparse.Namespace) -> int:
    """Print the statistics, once or every ``--watch`` until Ctrl-C; 0."""
    try:
        while True:
            # A connection per round: each round sees the database's current now(), and no
            # transaction stays open between rounds to hold back vacuum.
            with engine.connect() as conn:
                result = stats(conn, window=args.window)
            if args.json:
                text = to_json(result, indent=None if args.watch else 2)
            else:
                text = stats_text(result)
            if args.watch is None:
                print(text)
                return 0
            if not args.json:
                if sys.stdout.isatty():
                    print("\x1b[H\x1b[2J", end="")  # clear the screen, cursor home
                print(f"{result.as_of:%Y-%m-%d %H:%M:%S %Z}  (every {span(args.watch)})\n")
            print(text, flush=True)
            time.sleep(args.watch.total_seconds())
    except KeyboardInterrupt:
        return 0


def stats_text(result: Stats) -> str:
    """Three tables: queues, task run times, live workers."""
    window = span(result.window)
    queue_rows = [
        (
            q.queue + (" (paused)" if q.paused_at is not None else ""),
            *(q.counts[s] for s in STATUSES),
            q.due,
            span(q.oldest_due_age) if q.oldest_due_age is not None else "-",
            *(q.finished[s] for s in FINISHED_STATUSES),
            "-" if q.limits.concurrency is None else q.limits.concurrency,
            rate_cell(q.limits, q.rate_used),
        )
        for q in result.queues
    ]
    finished = tuple(f"{s.upper()}/{window}" for s in FINISHED_STATUSES)
    headers = ("QUEUE", *(s.upper() for s in STATUSES), "DUE", "OLDEST DUE", *finished)
    headers += ("CAP", "RATE")
    parts = [
        table(headers, queue_rows, right=len(headers) - 1) if queue_rows else "no jobs",
        "",
    ]
    task_rows = [(t.task, t.jobs, span(t.p50), span(t.p99)) for t in result.tasks]
    parts += [
        table(("TASK", f"FINISHED/{window}", "P50", "P99"), task_rows, right=3)
        if task_rows
        else f"no job finished in the last {window}",
        "",
    ]
    worker_rows = [
        (
            w.name,
            w.host,
            w.pid,
            ",".join(w.queues),
            w.concurrency,
            span(result.as_of - w.started_at),
            f"{span(result.as_of - w.last_seen_at)} ago",
        )
        for w in result.workers
    ]
    parts.append(
        table(("WORKER", "HOST", "PID", "QUEUES", "CONCURRENCY", "UP", "SEEN"), worker_rows)
        if worker_rows
        else "no live worker"
    )
    return "\n".join(parts)
