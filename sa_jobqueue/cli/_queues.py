"""``sa-jobqueue queues list|pause|resume|limit``: the queues, and what holds each back.

A pause, a resume or a change of limits is one transaction, the workers' wake-up included:
every worker sees it at commit. Pausing or resuming a queue no job, worker or setting knows
yet is done all the same, with a warning on stderr (a typo should not pass unnoticed).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from datetime import datetime

from sqlalchemy import Engine

from ..ops.health import span
from ..ops.queues import (
    QueueInfo,
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
from . import _values
from ._operator import database_time
from ._output import plain, table, to_json


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    database_option: Callable[[argparse.ArgumentParser], None],
) -> None:
    """Declare ``sa-jobqueue queues`` and its actions; :func:`refuse_conflicts` completes
    ``limit``'s grammar."""
    queues_ = commands.add_parser("queues", help="list queues; pause, resume or limit one")
    actions = queues_.add_subparsers(dest="action", required=True)
    listing = actions.add_parser(
        "list", help="each queue: queued, due and running jobs, and what holds it back"
    )
    database_option(listing)
    listing.add_argument("--json", action="store_true", help="JSON instead of a table")
    for name, what in (
        ("pause", "no worker starts the queue's jobs until it is resumed (running ones finish)"),
        ("resume", "workers take the queue's jobs again, woken at once"),
    ):
        sub = actions.add_parser(name, help=what)
        database_option(sub)
        sub.add_argument("name", type=_values.queue, metavar="NAME", help="the queue")
    limit = actions.add_parser(
        "limit",
        help="cap how many of the queue's jobs run at once, or start per period, across all"
        " workers",
        description="Set or remove the queue's limits, for every worker, in one transaction;"
        " prints the new limits and the old. Give at least one option; --clear goes alone.",
    )
    database_option(limit)
    limit.add_argument("name", type=_values.queue, metavar="NAME", help="the queue")
    cap = limit.add_mutually_exclusive_group()
    cap.add_argument(
        "--concurrency",
        type=_values.cap,
        metavar="N",
        help="at most N of its jobs running at once (lowering it stops no running job)",
    )
    cap.add_argument("--no-concurrency", action="store_true", help="remove the cap")
    rate = limit.add_mutually_exclusive_group()
    rate.add_argument(
        "--rate",
        type=_values.rate,
        metavar="N/PERIOD",
        help="at most N of its jobs start per period (50/s, 1000/h, 10/5m), windows aligned to"
        " the epoch",
    )
    rate.add_argument("--no-rate", action="store_true", help="remove the rate limit")
    per_key = limit.add_mutually_exclusive_group()
    per_key.add_argument(
        "--per-key",
        type=_values.cap,
        metavar="N",
        help="at most N jobs of one task with the same --key running at once",
    )
    per_key.add_argument("--no-per-key", action="store_true", help="remove the cap per key")
    key_rate = limit.add_mutually_exclusive_group()
    key_rate.add_argument(
        "--key-rate",
        type=_values.rate,
        metavar="N/PERIOD",
        help="at most N jobs of one task with the same --key start per period",
    )
    key_rate.add_argument("--no-key-rate", action="store_true", help="remove the rate per key")
    limit.add_argument(
        "--key",
        type=_values.key_field,
        metavar="FIELD",
        help="with --per-key or --key-rate: the payload's top-level field whose value is the"
        " key (one per queue)",
    )
    limit.add_argument("--clear", action="store_true", help="remove every limit (alone)")


def refuse_conflicts(args: argparse.Namespace, error: Callable[[str], object]) -> None:
    """Call ``error`` (``queues limit``'s parser's: usage and exit status 2) when ``args``
    changes nothing, gives ``--clear`` with another option, or ``--key`` without a limit per
    key (or one without the other)."""
    changes = (args.concurrency, args.rate, args.per_key, args.key_rate)
    removals = (args.no_concurrency, args.no_rate, args.no_per_key, args.no_key_rate)
    if args.clear and (any(c is not None for c in changes) or any(removals)):
        error("--clear removes every limit: give it alone")
    if not args.clear and all(c is None for c in changes) and not any(removals):
        error(
            "say what to change: --concurrency N, --rate N/PERIOD, --per-key N --key FIELD,"
            " --key-rate N/PERIOD --key FIELD, --no-concurrency, --no-rate, --no-per-key,"
            " --no-key-rate, or --clear"
        )
    if (args.per_key is None and args.key_rate is None) != (args.key is None):
        error("--key FIELD goes with --per-key N or --key-rate N/PERIOD")


def run(engine: Engine, args: argparse.Namespace) -> int:
    """Run ``queues <action>``; 0 (a pause of a paused queue is not an error)."""
    if args.action == "list":
        with engine.connect() as conn:
            found = list_queues(conn)
            moment = database_time(conn)
        print(queues_json(found) if args.json else queue_list(found, moment))
        return 0
    if args.action == "limit":
        return _limit(engine, args)
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


def _limit(engine: Engine, args: argparse.Namespace) -> int:
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


# -- rendering -------------------------------------------------------------------------------


def limits_text(limits: QueueLimits) -> str:
    """A queue's limits in words: ``at most 3 running, 50/1s``, ``no cap, no rate``, with
    ``, at most 1 per customer_id`` when it has a cap per key and ``, 10/1s per customer_id``
    when it has a rate per key."""
    cap = "no cap" if limits.concurrency is None else f"at most {limits.concurrency} running"
    text = f"{cap}, {'no rate' if limits.rate is None else limits.rate}"
    text += _per_key(limits, ", at most {} per {}")
    return text + _key_rate(limits, ", {} per {}")


def _per_key(limits: QueueLimits, form: str) -> str:
    if limits.key_concurrency is None:
        return ""
    return form.format(limits.key_concurrency, limits.key_field)


def _key_rate(limits: QueueLimits, form: str) -> str:
    if limits.key_rate is None:
        return ""
    return form.format(limits.key_rate, limits.key_field)


def rate_cell(limits: QueueLimits, used: int) -> str:
    """A queue's rates in a table's cell (``queues list``'s and ``stats``'s): ``50/1s (used
    12)``, with its rate per key, or ``-``."""
    cell = "-" if limits.rate is None else f"{limits.rate} (used {used})"
    if limits.key_rate is None:
        return cell
    per_key = _key_rate(limits, "{} per {}")
    return per_key if limits.rate is None else f"{cell}, {per_key}"


def queue_list(queues: Sequence[QueueInfo], now: datetime) -> str:
    """One line per queue: what holds it back, its limits, its live jobs, the oldest due job's
    wait."""

    def held(q: QueueInfo) -> str:
        reasons = [
            f"paused {span(now - q.paused_at)} ago" if r == "paused" and q.paused_at else r
            for r in q.held_back_by
        ]
        return ", ".join(reasons) or "-"

    rows = [
        (
            q.queue,
            held(q),
            ("-" if q.limits.concurrency is None else str(q.limits.concurrency))
            + _per_key(q.limits, " ({} per {})"),
            rate_cell(q.limits, q.rate_used),
            q.queued,
            q.due,
            q.running,
            span(q.oldest_due_age) if q.oldest_due_age is not None else "-",
        )
        for q in queues
    ]
    headers = ("QUEUE", "HELD BACK BY", "CAP", "RATE", "QUEUED", "DUE", "RUNNING", "OLDEST DUE")
    return (
        table(headers, rows, right=4) if rows else "no queues: no live jobs, none paused or limited"
    )


def queues_json(queues: Sequence[QueueInfo]) -> str:
    """The queues as JSON, each with its ``held_back_by`` list."""
    return to_json([{**plain(q), "held_back_by": q.held_back_by} for q in queues])
