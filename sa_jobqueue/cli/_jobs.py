"""Operating the queue: ``stats``, ``jobs list|show|retry|cancel|run-now|purge``, ``workflows
show|cancel|retry|delete`` (in :mod:`._workflows`), ``queues list|pause|resume|limit`` and
``check``.

Each command opens a short-lived engine of its own with time limits on its statements
(:data:`OPERATOR_SETTINGS`), so a query stuck behind a lock fails instead of hanging a
terminal or a monitoring probe. A database error is one line on stderr and exit status 1;
``check`` reports an unreachable database as critical (2) instead, as a probe should.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import Final

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from .._sql.clock import database_now
from ..database import check_schema, create_engine, ping
from ..errors import JobQueueError
from ..models import DEAD, FINISHED_STATUSES, RUNNING
from ..ops import count_purge, purge, stats
from ..ops.admin import cancel_job, get_job, job_edges, list_jobs, requeue_job
from ..ops.filters import RequeueAttempts
from ..ops.health import Thresholds, check, span, worst
from ..ops.queues import (
    QueueLimits,
    clear_queue_limits,
    list_queues,
    pause_queue,
    queue_known,
    queue_limits,
    resume_queue,
    set_queue_concurrency,
    set_queue_key_concurrency,
    set_queue_key_rate,
    set_queue_rate,
)
from ..ops.requeue import REQUEUE_BATCH, requeue_dead_jobs
from . import _bulk, _workflows
from ._exit import CHECK_EXIT, EXIT_ERROR, EXIT_USAGE
from ._reports import (
    findings_json,
    findings_text,
    job_detail,
    job_list,
    limits_text,
    queue_list,
    queues_json,
    stats_text,
    to_json,
)

#: The commands this module runs (``jobs``, ``workflows`` and ``queues`` with their actions).
OPERATOR_COMMANDS: Final = ("stats", "jobs", "workflows", "queues", "check")
#: Limits for the operator commands' sessions: a query stuck behind a lock or on an overloaded
#: server fails instead of hanging a terminal or a monitoring probe.
OPERATOR_SETTINGS: Final = {"statement_timeout": "60s", "lock_timeout": "10s"}


def operate(args: argparse.Namespace) -> int:
    """Run ``stats``, ``check`` or one of the ``jobs`` or ``queues`` actions; its exit status."""
    if args.command == "check":
        return _check(args)
    engine = _operator_engine(args)
    try:
        ping(engine)
        check_schema(engine)
        if args.command == "stats":
            return _stats(engine, args)
        if args.command == "queues":
            return _queues(engine, args)
        if args.command == "workflows":
            return _workflows.run(engine, args)
        action: Callable[[Engine, argparse.Namespace], int] = {
            "list": _jobs_list,
            "show": _jobs_show,
            "retry": _jobs_retry,
            "cancel": _jobs_cancel,
            "run-now": _bulk.run_now,
            "purge": _jobs_purge,
        }[args.action]
        return action(engine, args)
    except DBAPIError as exc:
        print(f"sa-jobqueue: {_reason(exc)}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        engine.dispose()


def _operator_engine(args: argparse.Namespace) -> Engine:
    return create_engine(
        args.database_url,
        pooler=args.pooler,
        settings=OPERATOR_SETTINGS,
        poolclass=NullPool,
        connect_args={"application_name": f"sa-jobqueue {args.command}"},
    )


def _reason(exc: DBAPIError) -> str:
    """A driver error's first line: what went wrong, without SQLAlchemy's statement dump."""
    text = str(exc.orig) if exc.orig is not None else str(exc)
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


def _now(conn: Connection) -> datetime:
    now: datetime = conn.execute(database_now()).scalar_one()
    return now


def _stats(engine: Engine, args: argparse.Namespace) -> int:
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


def _jobs_list(engine: Engine, args: argparse.Namespace) -> int:
    with engine.connect() as conn:
        found = list_jobs(
            conn,
            queue=args.queue,
            task=args.task,
            status=args.status,
            older_than=args.older_than,
            limit=args.limit,
            after_id=args.after,
            newest_first=args.newest_first,
            tags=args.tags,
        )
        now = _now(conn)
    if args.json:
        print(to_json(found))
        return 0
    print(job_list(found, now))
    if len(found) == args.limit:
        print(f"(more: --after {found[-1].id}{' --newest-first' if args.newest_first else ''})")
    return 0


def _jobs_show(engine: Engine, args: argparse.Namespace) -> int:
    with engine.connect() as conn:
        job = get_job(conn, args.job_id)
        waits_for, waited_by = job_edges(conn, args.job_id)
        now = _now(conn)
    if job is None:
        print(f"sa-jobqueue: no job with id {args.job_id}", file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        fields = {f.name: getattr(job, f.name) for f in dataclasses.fields(job)}
        print(to_json({**fields, "waits_for": waits_for, "waited_for_by": waited_by}))
    else:
        print(job_detail(job, now, waits_for, waited_by))
    return 0


def _jobs_retry(engine: Engine, args: argparse.Namespace) -> int:
    mode: RequeueAttempts = "reset" if args.reset_attempts else "extend"
    filtered = args.all or any(v is not None for v in (args.queue, args.task, args.older_than))
    if bool(args.job_ids) == bool(filtered):
        print(
            "sa-jobqueue: give either job IDs or filters (--queue, --task, --older-than, --all)",
            file=sys.stderr,
        )
        return EXIT_USAGE
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


def _jobs_cancel(engine: Engine, args: argparse.Namespace) -> int:
    if (refused := _bulk.refuse_mixed(args)) is not None:
        return refused
    if args.job_ids and args.dry_run:
        print("sa-jobqueue: --dry-run counts jobs chosen by filter, not by ID", file=sys.stderr)
        return EXIT_USAGE
    if not args.job_ids:
        return _bulk.cancel_by_filter(engine, args)
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


def _jobs_purge(engine: Engine, args: argparse.Namespace) -> int:
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


def _queues(engine: Engine, args: argparse.Namespace) -> int:
    if args.action == "list":
        with engine.connect() as conn:
            found = list_queues(conn)
            now = _now(conn)
        print(queues_json(found) if args.json else queue_list(found, now))
        return 0
    if args.action == "limit":
        return _queues_limit(engine, args)
    # One transaction: the change and, for a resume, the workers' wake-up commit together.
    with engine.begin() as conn:
        known = queue_known(conn, args.name)
        if args.action == "pause":
            changed = pause_queue(conn, args.name)
        else:
            changed = resume_queue(conn, args.name)
    if not known:
        # Done all the same (a queue may be paused before its first job), but a typo should
        # not pass unnoticed.
        print(
            f"sa-jobqueue: warning: no job, worker or setting knows queue {args.name} yet"
            " (a typo?); "
            + (
                "paused all the same: its jobs wait once they come"
                if args.action == "pause"
                else "nothing to resume"
            ),
            file=sys.stderr,
        )
    done = "paused" if args.action == "pause" else "resumed"
    if changed:
        print(f"queue {args.name}: {done}")
    else:
        # Not an error: the queue is in the state asked for, as after a retried command.
        print(f"queue {args.name}: already {'paused' if args.action == 'pause' else 'running'}")
    return 0


def _queues_limit(engine: Engine, args: argparse.Namespace) -> int:
    # One transaction: both limits change together, with the workers' wake-up, at commit.
    with engine.begin() as conn:
        if args.clear:
            before = clear_queue_limits(conn, args.name)
        else:
            changes: list[QueueLimits] = []
            if args.concurrency is not None or args.no_concurrency:
                changes.append(set_queue_concurrency(conn, args.name, args.concurrency))
            if args.rate is not None or args.no_rate:
                changes.append(set_queue_rate(conn, args.name, args.rate))
            if args.per_key is not None or args.no_per_key:
                changes.append(
                    set_queue_key_concurrency(conn, args.name, args.per_key, key=args.key)
                )
            if args.key_rate is not None or args.no_key_rate:
                changes.append(set_queue_key_rate(conn, args.name, args.key_rate, key=args.key))
            before = changes[0]  # the first change saw the limits as they were
        after = queue_limits(conn).get(args.name, QueueLimits())
    print(f"queue {args.name}: {limits_text(after)} (was: {limits_text(before)})")
    return 0


def _check(args: argparse.Namespace) -> int:
    thresholds = Thresholds(
        max_wait=args.max_wait,
        lease_grace=args.lease_grace,
        dead_window=args.dead_window,
        max_dead=args.max_dead,
        max_dead_tuples=args.max_dead_tuples,
        max_transaction_age=args.max_transaction_age,
        max_xmin_age=args.max_xmin_age,
        stale_after=args.stale_after,
        max_paused=args.max_paused,
    )
    engine: Engine | None = None
    try:
        engine = _operator_engine(args)
        ping(engine)
        with engine.connect() as conn:
            findings = check(conn, thresholds)
    except (JobQueueError, DBAPIError) as exc:
        reason = _reason(exc) if isinstance(exc, DBAPIError) else str(exc)
        print(f"sa-jobqueue: {reason}", file=sys.stderr)
        return CHECK_EXIT["critical"]
    finally:
        if engine is not None:
            engine.dispose()
    print(findings_json(findings) if args.json else findings_text(findings))
    return CHECK_EXIT[worst(findings)]
