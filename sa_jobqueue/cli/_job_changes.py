"""``sa-jobqueue jobs retry|cancel|run-now|purge``: the actions that change jobs.

By ID, each job is changed or, with the reason on stderr, left as it is (exit status 1 when
one was). By filter (``--queue``, ``--task``, ``--older-than``, ``--all``), the jobs go in
batches, each a transaction of its own as the dashboard's clicks are: a long run holds no lock
for long, and what it did stays done if it is interrupted. ``--dry-run`` counts what a run
would go through, changing nothing.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from sqlalchemy import Connection, Engine

from ..models import DEAD, FINISHED_STATUSES, RUNNING
from ..ops import count_purge, purge
from ..ops.admin import cancel_job, get_job, requeue_job
from ..ops.bulk import BULK_BATCH, Action, BulkBatch, cancel_jobs, count_matching, run_jobs_now
from ..ops.filters import RequeueAttempts
from ..ops.health import span
from ..ops.requeue import REQUEUE_BATCH, requeue_dead_jobs
from . import _values
from ._exit import EXIT_ERROR, EXIT_USAGE

#: The most a ``--dry-run`` counts before it says "over" (counting a history of millions
#: would take as long as the run).
DRY_RUN_UPTO: Final = 10_000

Step = Callable[[Connection, int], BulkBatch]


def filter_options(sub: argparse.ArgumentParser) -> None:
    """``--queue``, ``--task`` and ``--older-than``: the filters ``jobs list`` shares."""
    sub.add_argument("--queue", type=_values.queue, help="only this queue")
    sub.add_argument("--task", type=_values.task, help="only this task")
    sub.add_argument(
        "--older-than",
        type=_values.duration,
        metavar="DURATION",
        help="only jobs created longer ago than this (7d, 2h)",
    )


def add_parsers(
    actions: argparse._SubParsersAction[argparse.ArgumentParser],
    database_option: Callable[[argparse.ArgumentParser], None],
) -> None:
    """Declare ``jobs retry``, ``cancel``, ``run-now`` and ``purge`` among ``actions``."""
    retry = actions.add_parser("retry", help="put dead jobs back in their queues, due now")
    database_option(retry)
    retry.add_argument("job_ids", type=int, nargs="*", metavar="ID", help="the dead jobs")
    filter_options(retry)
    retry.add_argument("--all", action="store_true", help="every dead job (no IDs, no filters)")
    retry.add_argument(
        "--reset-attempts",
        action="store_true",
        help="count attempts from 0 again (default: keep them and raise max_attempts)",
    )

    cancel = actions.add_parser("cancel", help="cancel queued jobs, ask running ones to stop")
    database_option(cancel)
    cancel.add_argument("job_ids", type=int, nargs="*", metavar="ID", help="the jobs")
    filter_options(cancel)
    cancel.add_argument(
        "--all", action="store_true", help="every queued and running job (no IDs, no filters)"
    )
    cancel.add_argument("--dry-run", action="store_true", help="count them, change nothing")

    run_now_ = actions.add_parser(
        "run-now", help="make queued jobs that are due later due now (limits still apply)"
    )
    database_option(run_now_)
    run_now_.add_argument("job_ids", type=int, nargs="*", metavar="ID", help="the jobs")
    filter_options(run_now_)
    run_now_.add_argument(
        "--all", action="store_true", help="every job due later (no IDs, no filters)"
    )
    run_now_.add_argument("--dry-run", action="store_true", help="count them, change nothing")

    purge_ = actions.add_parser("purge", help="delete finished jobs in batches")
    database_option(purge_)
    purge_.add_argument(
        "--status",
        type=_values.statuses,
        required=True,
        help="comma-separated, of succeeded, dead, cancelled (queued and running are refused)",
    )
    purge_.add_argument(
        "--older-than",
        type=_values.duration,
        required=True,
        metavar="DURATION",
        help="only jobs finished longer ago than this (7d, 2h; 0 for all)",
    )
    purge_.add_argument("--queue", type=_values.queue, help="only this queue")
    purge_.add_argument("--task", type=_values.task, help="only this task")
    purge_.add_argument(
        "--batch", type=_values.page, default=1000, help="rows per transaction (default 1000)"
    )
    purge_.add_argument("--dry-run", action="store_true", help="count them, delete nothing")


def run(engine: Engine, args: argparse.Namespace) -> int:
    """Run ``jobs retry``, ``cancel``, ``run-now`` or ``purge``; its exit status."""
    action: Callable[[Engine, argparse.Namespace], int] = {
        "retry": _retry,
        "cancel": _cancel,
        "run-now": run_now,
        "purge": _purge,
    }[args.action]
    return action(engine, args)


def _retry(engine: Engine, args: argparse.Namespace) -> int:
    mode: RequeueAttempts = "reset" if args.reset_attempts else "extend"
    if (refused := refuse_mixed(args)) is not None:
        return refused
    if args.job_ids:
        failed = 0
        with engine.begin() as conn:
            for job_id in args.job_ids:
                if requeue_job(conn, job_id, attempts=mode):
                    print(f"job {job_id}: queued again")
                    continue
                failed += 1
                job = get_job(conn, job_id)
                if job is None:
                    reason = "no such job"
                elif job.status != DEAD:
                    reason = f"not dead but {job.status}, left as it is"
                else:
                    reason = (
                        "left dead: a waiting, queued or running job of its task holds its"
                        " unique key"
                    )
                print(f"sa-jobqueue: job {job_id}: {reason}", file=sys.stderr)
        return EXIT_ERROR if failed else 0
    requeued = kept = 0
    after: int | None = None
    while True:
        # A transaction per batch: a long retry holds no locks for long, and what it did
        # stays done if it is interrupted.
        with engine.begin() as conn:
            done = requeue_dead_jobs(
                conn,
                queue=args.queue,
                task=args.task,
                older_than=args.older_than,
                attempts=mode,
                after_id=after,
                batch=REQUEUE_BATCH,
            )
        requeued += done.requeued
        kept += done.kept
        if not done.more:
            break
        after = done.last_id
    print(f"requeued {requeued} dead job(s)")
    if kept:
        print(
            f"sa-jobqueue: {kept} left dead: a waiting, queued or running job of the task"
            " holds the unique key",
            file=sys.stderr,
        )
        return EXIT_ERROR
    return 0


def _cancel(engine: Engine, args: argparse.Namespace) -> int:
    if (refused := _refuse_choice(args)) is not None:
        return refused
    if not args.job_ids:
        return cancel_by_filter(engine, args)
    failed = 0
    with engine.begin() as conn:
        for job_id in args.job_ids:
            if cancel_job(conn, job_id):
                job = get_job(conn, job_id)
                requested = job is not None and job.status == RUNNING
                print(
                    f"job {job_id}: "
                    + ("cancellation requested; its worker stops it" if requested else "cancelled")
                )
                continue
            failed += 1
            job = get_job(conn, job_id)
            reason = "no such job" if job is None else f"already {job.status}, left as it is"
            print(f"sa-jobqueue: job {job_id}: {reason}", file=sys.stderr)
    return EXIT_ERROR if failed else 0


def _purge(engine: Engine, args: argparse.Namespace) -> int:
    live = [s for s in args.status if s not in FINISHED_STATUSES]
    if live:
        print(
            f"sa-jobqueue: refusing to purge {' and '.join(live)} jobs: only finished ones"
            f" ({', '.join(FINISHED_STATUSES)}); cancel them first",
            file=sys.stderr,
        )
        return EXIT_USAGE
    what = (
        f"{'/'.join(args.status)} job(s) finished over {span(args.older_than)} ago"
        + (f" in queue {args.queue}" if args.queue else "")
        + (f" of task {args.task}" if args.task else "")
    )
    selection = (args.status, args.older_than, args.queue, args.task)
    with engine.connect() as conn:
        if args.dry_run:
            print(f"would purge {count_purge(conn, *selection)} {what}")
            return 0
        deleted = purge(conn, *selection, batch=args.batch)
    print(f"purged {deleted} {what}")
    return 0


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


def _refuse_choice(args: argparse.Namespace) -> int | None:
    """As :func:`refuse_mixed`, and EXIT_USAGE for ``--dry-run`` with IDs (it counts jobs
    chosen by filter)."""
    if (refused := refuse_mixed(args)) is not None:
        return refused
    if args.job_ids and args.dry_run:
        print("sa-jobqueue: --dry-run counts jobs chosen by filter, not by ID", file=sys.stderr)
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
    if (refused := _refuse_choice(args)) is not None:
        return refused
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
