"""``jobs cancel`` and ``jobs run-now`` by filter: the dashboard's bulk actions, from a shell.

Each batch of :data:`~sa_jobqueue.ops.bulk.BULK_BATCH` jobs is a transaction of its own, as
the dashboard's clicks are: a long run holds no lock for long, and what it did stays done if
it is interrupted. ``--dry-run`` counts what a run would go through, changing nothing.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from sqlalchemy import Connection, Engine

from ..ops.bulk import BULK_BATCH, Action, BulkBatch, cancel_jobs, count_matching, run_jobs_now
from ._exit import EXIT_USAGE

#: The most a ``--dry-run`` counts before it says "over" (counting a history of millions
#: would take as long as the run).
DRY_RUN_UPTO: Final = 10_000

Step = Callable[[Connection, int], BulkBatch]


@dataclass
class Totals:
    """What all the batches of one run did."""

    done: int = 0
    requested: int = 0
    left: int = 0

    def add(self, batch: BulkBatch) -> None:
        self.done += batch.done
        self.requested += batch.requested
        self.left += batch.left


def filtered(args: argparse.Namespace) -> bool:
    """Whether the command chose its jobs by filter (or ``--all``)."""
    return bool(args.all) or any(v is not None for v in (args.queue, args.task, args.older_than))


def refuse_mixed(args: argparse.Namespace) -> int | None:
    """EXIT_USAGE, with the reason, unless exactly one of IDs and filters was given."""
    if bool(args.job_ids) == filtered(args):
        print(
            "sa-jobqueue: give either job IDs or filters (--queue, --task, --older-than, --all)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    return None


def run_batches(engine: Engine, step: Step) -> Totals:
    """Call ``step`` batch after batch, each in its own transaction, past the last id the
    previous one picked, until a batch says nothing more matches."""
    totals = Totals()
    after = 0
    while True:
        with engine.begin() as conn:
            batch = step(conn, after)
        totals.add(batch)
        if not batch.more or batch.last_id is None:
            return totals
        after = batch.last_id


def _dry_run(engine: Engine, action: Action, args: argparse.Namespace, what: str) -> int:
    with engine.connect() as conn:
        found = count_matching(
            conn,
            action,
            queue=args.queue,
            task=args.task,
            older_than=args.older_than,
            upto=DRY_RUN_UPTO,
        )
    count = f"over {DRY_RUN_UPTO:,}" if found > DRY_RUN_UPTO else f"{found}"
    print(f"would {what} {count} job(s)")
    return 0


def cancel_by_filter(engine: Engine, args: argparse.Namespace) -> int:
    """``jobs cancel --queue/--task/--older-than/--all``: queued jobs end cancelled, running
    ones are asked to stop (waiting jobs are reached by id only, as in the dashboard)."""
    if args.dry_run:
        return _dry_run(engine, "cancel", args, "cancel or stop")
    totals = run_batches(
        engine,
        lambda conn, after: cancel_jobs(
            conn,
            queue=args.queue,
            task=args.task,
            older_than=args.older_than,
            batch=BULK_BATCH,
            after_id=after,
        ),
    )
    print(f"cancelled {totals.done} job(s); cancellation requested for {totals.requested}")
    if totals.left:
        print(f"{totals.left} changed or locked meanwhile, left as they were")
    return 0


def run_now(engine: Engine, args: argparse.Namespace) -> int:
    """``jobs run-now``: queued jobs due later are made due now, by ID or by filter."""
    if (refused := refuse_mixed(args)) is not None:
        return refused
    if args.dry_run and args.job_ids:
        print("sa-jobqueue: --dry-run counts jobs chosen by filter, not by ID", file=sys.stderr)
        return EXIT_USAGE
    if args.dry_run:
        return _dry_run(engine, "run_now", args, "make due now")
    ids = sorted(set(args.job_ids)) or None
    totals = run_batches(
        engine,
        lambda conn, after: run_jobs_now(
            conn,
            ids=ids,
            queue=args.queue,
            task=args.task,
            older_than=args.older_than,
            batch=BULK_BATCH,
            after_id=after,
        ),
    )
    print(f"made {totals.done} job(s) due now")
    if totals.left:
        print(
            f"{totals.left} left as they were: not queued for later (already due, running,"
            " waiting or finished), or locked meanwhile"
        )
    return 0
