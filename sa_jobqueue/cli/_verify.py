"""``sa-jobqueue verify`` on the command line: its options, and the exit status.

The run itself is :mod:`sa_jobqueue.verify`; this module only reads the options, says
what goes on, prints the report and picks the exit status.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Final

from sqlalchemy.exc import DBAPIError

from ..errors import JobQueueError
from ..verify.hammer import reason, verify
from ..verify.report import Settings
from ._exit import EXIT_USAGE

#: Jobs were lost or doubled.
EXIT_FAILED: Final = 1
#: Ctrl-C or SIGTERM: 128 + SIGINT (2), as a shell shows it.
EXIT_INTERRUPTED: Final = 130

log = logging.getLogger("sa_jobqueue.verify")


def _number(kind: type[int] | type[float], low: float, high: float) -> Callable[[str], Any]:
    def parse(value: str) -> Any:
        try:
            number = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
        if not low <= number <= high:
            raise argparse.ArgumentTypeError(f"must be from {low:g} to {high:g}")
        return number

    return parse


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    database_option: Callable[[argparse.ArgumentParser], None],
) -> None:
    """Declare ``sa-jobqueue verify`` and its options."""
    d = Settings()
    sub = commands.add_parser(
        "verify",
        help="prove the queue's promise on your database: N jobs, W workers, one of them killed",
        description="Run N jobs across W worker processes in a temporary schema of your"
        " database, SIGKILL one worker mid-run, and report duplicates, losses, throughput and"
        " latency. Exit 0: nothing lost or doubled; 1: something was; 2: could not run.",
    )
    database_option(sub)
    sub.add_argument(
        "--jobs",
        type=_number(int, 1, 10_000_000),
        default=d.jobs,
        metavar="N",
        help=f"jobs to run (default {d.jobs:,})",
    )
    sub.add_argument(
        "--workers",
        type=_number(int, 1, 64),
        default=d.workers,
        metavar="W",
        help=f"worker processes (default {d.workers})",
    )
    sub.add_argument(
        "--concurrency",
        type=_number(int, 1, 256),
        default=d.concurrency,
        metavar="N",
        help=f"handler threads per worker (default {d.concurrency})",
    )
    sub.add_argument(
        "--work-ms",
        type=_number(float, 0, 60_000),
        default=2.0,
        metavar="MS",
        help="milliseconds each handler sleeps, its 'work' (default 2)",
    )
    sub.add_argument(
        "--lease",
        type=_number(float, 1, 3600),
        default=3.0,
        metavar="SECONDS",
        help="the jobs' lease: how long the killed worker's jobs wait to be reclaimed (default 3)",
    )
    sub.add_argument(
        "--timeout",
        type=_number(float, 1, 86_400),
        default=300.0,
        metavar="SECONDS",
        help="give up waiting for the jobs after this long; unfinished ones count as lost"
        " (default 300)",
    )
    sub.add_argument(
        "--no-listen",
        dest="listen",
        action="store_false",
        help="workers poll only, no LISTEN (as behind PgBouncer in transaction mode)",
    )
    sub.add_argument("--json", action="store_true", help="the report as JSON")
    sub.add_argument(
        "--keep",
        action="store_true",
        help="keep the schema (and the workers' logs) for a look afterwards",
    )


def run(args: argparse.Namespace) -> int:
    """``sa-jobqueue verify``: 0 when nothing was lost or doubled, 1 otherwise, 2 on errors."""
    settings = Settings(
        jobs=args.jobs,
        workers=args.workers,
        concurrency=args.concurrency,
        work=timedelta(milliseconds=args.work_ms),
        lease=timedelta(seconds=args.lease),
        timeout=timedelta(seconds=args.timeout),
        listen=args.listen,
        keep=args.keep,
        pooler=args.pooler,
    )

    def say(message: str) -> None:
        if not args.json:
            print(f"sa-jobqueue verify: {message}", file=sys.stderr, flush=True)

    if log.getEffectiveLevel() > logging.DEBUG:
        logging.getLogger("alembic").setLevel(logging.WARNING)  # no line per revision
    # SIGTERM (a cancelled CI job, `kill`) cleans up as Ctrl-C does.
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler) if main_thread else None
    try:
        report = verify(args.database_url, settings, say)
    except KeyboardInterrupt:
        print("sa-jobqueue: verify interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (JobQueueError, DBAPIError) as exc:
        print(f"sa-jobqueue: {reason(exc)}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    print(report.as_json() if args.json else report.as_text())
    return 0 if report.ok else EXIT_FAILED
