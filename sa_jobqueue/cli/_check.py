"""``sa-jobqueue check``: the health checks, as a monitoring probe runs them.

Exit status 0 when all is well, 1 on a warning, 2 on a critical finding; a database that
cannot be reached is critical too (one line on stderr), as a probe should report it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from ..database import ping
from ..errors import JobQueueError
from ..ops.health import Finding, Thresholds, check, span, worst
from . import _values
from ._exit import CHECK_EXIT
from ._operator import operator_engine, reason
from ._output import to_json


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    database_option: Callable[[argparse.ArgumentParser], None],
) -> None:
    """Declare ``sa-jobqueue check`` and its thresholds, each defaulting to
    :class:`~sa_jobqueue.ops.health.Thresholds`'."""
    check_ = commands.add_parser("check", help="health checks: exit 0 ok, 1 warning, 2 critical")
    database_option(check_)
    d = Thresholds()
    for option, default, what in (
        ("--max-wait", d.max_wait, "a due job waiting longer is a warning"),
        ("--lease-grace", d.lease_grace, "a lease expired longer ago, not reclaimed, is one"),
        ("--dead-window", d.dead_window, "how far back dead jobs are counted"),
        ("--max-transaction-age", d.max_transaction_age, "a transaction pinning xmin longer"),
        ("--stale-after", d.stale_after, "a worker not seen for longer is not live"),
        ("--max-paused", d.max_paused, "a queue paused longer, with due jobs, is a warning"),
    ):
        check_.add_argument(
            option,
            type=_values.duration,
            default=default,
            metavar="DURATION",
            help=f"{what} (default {span(default)})",
        )
    for option, number, what in (
        ("--max-dead", d.max_dead, "more dead jobs in the window are a warning"),
        ("--max-dead-tuples", d.max_dead_tuples, "more dead row versions in the jobs table"),
        ("--max-xmin-age", d.max_xmin_age, "a session or slot this many transactions behind"),
    ):
        check_.add_argument(
            option,
            type=_values.count,
            default=number,
            metavar="N",
            help=f"{what} (default {number})",
        )
    check_.add_argument("--json", action="store_true", help="JSON instead of text")


def run(args: argparse.Namespace) -> int:
    """Print the findings; the exit status of the worst (``CHECK_EXIT``)."""
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
        engine = operator_engine(args)
        ping(engine)
        with engine.connect() as conn:
            findings = check(conn, thresholds)
    except (JobQueueError, DBAPIError) as exc:
        why = reason(exc) if isinstance(exc, DBAPIError) else str(exc)
        print(f"sa-jobqueue: {why}", file=sys.stderr)
        return CHECK_EXIT["critical"]
    finally:
        if engine is not None:
            engine.dispose()
    print(findings_json(findings) if args.json else findings_text(findings))
    return CHECK_EXIT[worst(findings)]


def findings_text(findings: Sequence[Finding]) -> str:
    """One line per finding, with what to do under each that is not ok."""
    width = max((len(f.check) for f in findings), default=0)
    lines = []
    for f in findings:
        lines.append(f"{f.severity.upper():<8}  {f.check:<{width}}  {f.message}")
        if f.action:
            lines.append(f"{'':<8}  {'':<{width}}  what to do: {f.action}")
    return "\n".join(lines)


def findings_json(findings: Sequence[Finding]) -> str:
    """The findings and the overall severity, as JSON."""
    return to_json({"status": worst(findings), "findings": list(findings)})
