"""The command line's grammar: every command, option, default and help text.

:func:`build_parser` is the whole of it, and :func:`parse_args` refuses options that do not go
together; the options' values are read by :mod:`._values`.
``verify`` and ``web`` bring their own options (:func:`._verify.add_parser`,
:func:`._web.add_parser`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Final

from .. import __version__
from ..database import POOLER_ENV, POOLERS
from ..ops.health import Thresholds, span
from . import _values
from ._verify import add_parser as add_verify_parser
from ._web import add_parser as add_web_parser

LOG_FORMATS: Final = ("text", "json")
LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR")
#: The level when --log-level is not given. Alembic's own records are shown only when a level
#: is given (see configure_logging).
DEFAULT_LOG_LEVEL: Final = "INFO"
#: The worker's queues when no --queues is given: for lists a command line cannot hold.
QUEUES_ENV: Final = "SA_JOBQUEUE_QUEUES"

#: Options every command takes, before its name or after it (after it, it wins): one entry
#: each, the flag and its add_argument settings; _add_global_options puts them everywhere.
GLOBAL_OPTIONS: Final[tuple[tuple[str, dict[str, Any]], ...]] = (
    (
        "--log-level",
        {
            "choices": LOG_LEVELS,
            "default": None,
            "help": f"least severe records logged (default {DEFAULT_LOG_LEVEL}; Alembic's"
            " own only when given as INFO or DEBUG; DEBUG also shows an error's traceback)",
        },
    ),
    (
        "--pooler",
        {
            "choices": POOLERS,
            "default": os.environ.get(POOLER_ENV, "session"),
            "help": "what stands between us and PostgreSQL: 'session' (a direct connection, or"
            " PgBouncer in session mode) or 'transaction' (PgBouncer in transaction mode:"
            " no LISTEN, no prepared statements, settings per transaction); default"
            " $SA_JOBQUEUE_POOLER or session",
        },
    ),
    (
        "--log-format",
        {
            "choices": LOG_FORMATS,
            "default": "text",
            "help": "text lines, or one JSON object per line (default text; json adds a record"
            " per job transition to a worker's log)",
        },
    ),
)


def build_parser() -> argparse.ArgumentParser:
    """The ``sa-jobqueue`` parser with every subcommand and the global options on each."""
    parser = argparse.ArgumentParser(
        prog="sa-jobqueue", description="A job queue in your PostgreSQL database."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    _worker_parser(commands)
    migrate = commands.add_parser("migrate", help="create or upgrade the sa_jobqueue tables")
    _database_option(migrate)
    _operator_parsers(commands)
    add_verify_parser(commands, _database_option)
    add_web_parser(commands, _database_option)
    _add_global_options(parser)  # last: every subcommand exists by now
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line read by :func:`build_parser`, and options that do not go together
    refused as argparse refuses a bad value: the command's usage and exit status 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "queues" and args.action == "limit":
        changes = (args.concurrency, args.rate, args.per_key, args.key_rate)
        removals = (args.no_concurrency, args.no_rate, args.no_per_key, args.no_key_rate)
        limit_parser = _subparser(parser, "queues", "limit")
        if args.clear and (any(c is not None for c in changes) or any(removals)):
            limit_parser.error("--clear removes every limit: give it alone")
        if not args.clear and all(c is None for c in changes) and not any(removals):
            limit_parser.error(
                "say what to change: --concurrency N, --rate N/PERIOD, --per-key N --key FIELD,"
                " --key-rate N/PERIOD --key FIELD, --no-concurrency, --no-rate, --no-per-key,"
                " --no-key-rate, or --clear"
            )
        if (args.per_key is None and args.key_rate is None) != (args.key is None):
            limit_parser.error("--key FIELD goes with --per-key N or --key-rate N/PERIOD")
    return args


def _subparser(parser: argparse.ArgumentParser, *path: str) -> argparse.ArgumentParser:
    """The parser of the subcommand at ``path`` (``"queues", "limit"``)."""
    for name in path:
        (choices,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = choices.choices[name]
    return parser


def _database_option(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL"),
        help="PostgreSQL URL (default: $DATABASE_URL)",
    )


def _add_global_options(parser: argparse.ArgumentParser, *, top: bool = True) -> None:
    """Give ``parser`` and each of its subcommands, at every depth, the GLOBAL_OPTIONS.

    Only the top level has the defaults. On a subcommand an option left out sets nothing
    (``SUPPRESS``), so it does not undo the same option given before the subcommand's name.
    """
    for flag, settings in GLOBAL_OPTIONS:
        default = settings["default"] if top else argparse.SUPPRESS
        parser.add_argument(flag, **{**settings, "default": default})
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # an alias is the same parser
                _add_global_options(sub, top=False)


def _worker_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    worker = commands.add_parser("worker", help="run a worker for the tasks of module:attribute")
    worker.add_argument("app", help="where your JobQueue lives, as module:attribute")
    _database_option(worker)
    worker.add_argument("--concurrency", type=int, default=10, help="jobs run at once")
    worker.add_argument(
        "--queues",
        type=_values.queues,
        default=os.environ.get(QUEUES_ENV) or None,
        help="comma-separated queues to serve, sharing --concurrency (a,b), or each with its"
        " own threads (emails=8,reports=1); a pattern serves every queue it matches (tenant-*,"
        " or * for all). Default: $SA_JOBQUEUE_QUEUES, else the queues the tasks declare",
    )
    worker.add_argument(
        "--queues-file",
        type=_values.queues_file,
        metavar="PATH",
        help="more queues, as --queues takes them, one or more a line (# comments): for lists"
        " too long for a command line",
    )
    worker.add_argument(
        "--poll-interval",
        type=_values.seconds,
        default=timedelta(seconds=1),
        help="time between safety-net polls, in seconds or with a unit: 500ms, 2s (default 1)",
    )
    worker.add_argument(
        "--shutdown-grace",
        type=_values.seconds,
        default=timedelta(seconds=30),
        help="how long running jobs get to finish on SIGTERM: 30, 30s, 2m (default 30)",
    )
    worker.add_argument(
        "--no-listen",
        dest="listen",
        action="store_false",
        help="poll only, no LISTEN (for PgBouncer in transaction mode)",
    )
    worker.add_argument(
        "--retention",
        type=_values.retention,
        default=timedelta(days=1),
        metavar="DURATION",
        help="keep succeeded and cancelled jobs this long (3600, 12h, 7d), 'forever' to keep"
        " them (default 1d)",
    )
    worker.add_argument(
        "--prefetch",
        type=int,
        default=None,
        metavar="N",
        help="jobs claimed ahead of free threads, handed back on shutdown (default: adapts)",
    )
    worker.add_argument(
        "--wait-for-database",
        type=float,
        default=0,
        metavar="SECONDS",
        help="keep retrying an unreachable database at start for up to this long (default 0)",
    )
    worker.add_argument(
        "--burst",
        action="store_true",
        help="run the jobs that can start now, then exit (never waits on a pause, on other"
        " workers' jobs holding a cap, or on a rate window more than 10s off)",
    )
    worker.add_argument(
        "--processes",
        type=int,
        metavar="N",
        help="run N worker processes under a supervisor that restarts them (see --max-*-per-child)",
    )
    for option, what in (("jobs", "run N jobs"), ("memory", "grown past N MiB resident")):
        worker.add_argument(
            f"--max-{option}-per-child",
            type=int,
            metavar="N",
            help=f"with --processes, replace a worker process once it has {what}",
        )
    worker.add_argument(
        "--metrics-port",
        type=_values.port,
        metavar="PORT",
        help="serve Prometheus metrics on this port (needs the 'metrics' extra; 0: any free one)",
    )
    worker.add_argument(
        "--metrics-address",
        default="0.0.0.0",
        metavar="ADDRESS",
        help="address the metrics endpoint listens on (default 0.0.0.0, every interface)",
    )
    worker.add_argument(
        "--health-port",
        type=_values.port,
        metavar="PORT",
        help="serve liveness (/livez) and readiness (/readyz) probes on this port (0: any)",
    )
    worker.add_argument(
        "--health-address",
        default="0.0.0.0",
        metavar="ADDRESS",
        help="address the probes listen on (default 0.0.0.0, every interface)",
    )
    worker.add_argument(
        "--stalled-after",
        type=_values.seconds,
        default=None,
        metavar="DURATION",
        help="/livez fails once the claim loop or the heartbeat has not gone round for this"
        " long (default: 2 x (the longer of 1.2 x --poll-interval and 5s, + 30s): 70s at 1s)",
    )


def _operator_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    stats_ = commands.add_parser(
        "stats", help="jobs per queue and status, backlog age, run times, live workers"
    )
    _database_option(stats_)
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
    _jobs_parsers(commands)
    _workflows_parsers(commands)
    _queues_parsers(commands)
    _check_parser(commands)


def _jobs_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    jobs = commands.add_parser("jobs", help="list, show, retry, cancel, run now or purge jobs")
    actions = jobs.add_subparsers(dest="action", required=True)

    def filters(sub: argparse.ArgumentParser, age: str) -> None:
        sub.add_argument("--queue", type=_values.queue, help="only this queue")
        sub.add_argument("--task", type=_values.task, help="only this task")
        sub.add_argument(
            "--older-than",
            type=_values.duration,
            metavar="DURATION",
            help=f"only jobs {age} (7d, 2h)",
        )

    listing = actions.add_parser(
        "list", help="jobs in id order, oldest first unless --newest-first"
    )
    _database_option(listing)
    filters(listing, "created longer ago than this")
    listing.add_argument("--status", type=_values.statuses, help="comma-separated statuses")
    listing.add_argument(
        "--tag",
        type=_values.tag,
        action="append",
        dest="tags",
        metavar="TAG",
        help="only jobs carrying this tag; repeat it for jobs carrying all of them",
    )
    listing.add_argument(
        "--limit", type=_values.page, default=50, help="at most this many (default 50)"
    )
    listing.add_argument("--after", type=int, metavar="ID", help="start after this id (next page)")
    listing.add_argument(
        "--newest-first",
        action="store_true",
        help="highest id first; --after then pages on to lower ids",
    )
    listing.add_argument("--json", action="store_true", help="JSON instead of a table")

    show = actions.add_parser(
        "show", help="one job in full: its attempts, its last error's traceback"
    )
    _database_option(show)
    show.add_argument("job_id", type=int, metavar="ID")
    show.add_argument("--json", action="store_true", help="JSON instead of text")

    retry = actions.add_parser("retry", help="put dead jobs back in their queues, due now")
    _database_option(retry)
    retry.add_argument("job_ids", type=int, nargs="*", metavar="ID", help="the dead jobs")
    filters(retry, "created longer ago than this")
    retry.add_argument("--all", action="store_true", help="every dead job (no IDs, no filters)")
    retry.add_argument(
        "--reset-attempts",
        action="store_true",
        help="count attempts from 0 again (default: keep them and raise max_attempts)",
    )

    cancel = actions.add_parser("cancel", help="cancel queued jobs, ask running ones to stop")
    _database_option(cancel)
    cancel.add_argument("job_ids", type=int, nargs="*", metavar="ID", help="the jobs")
    filters(cancel, "created longer ago than this")
    cancel.add_argument(
        "--all", action="store_true", help="every queued and running job (no IDs, no filters)"
    )
    cancel.add_argument("--dry-run", action="store_true", help="count them, change nothing")

    run_now = actions.add_parser(
        "run-now", help="make queued jobs that are due later due now (limits still apply)"
    )
    _database_option(run_now)
    run_now.add_argument("job_ids", type=int, nargs="*", metavar="ID", help="the jobs")
    filters(run_now, "created longer ago than this")
    run_now.add_argument(
        "--all", action="store_true", help="every job due later (no IDs, no filters)"
    )
    run_now.add_argument("--dry-run", action="store_true", help="count them, change nothing")

    purge_ = actions.add_parser("purge", help="delete finished jobs in batches")
    _database_option(purge_)
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


def _workflows_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    workflows = commands.add_parser(
        "workflows", help="show, cancel, retry or delete a workflow's jobs, together"
    )
    actions = workflows.add_subparsers(dest="action", required=True)
    helps = {
        "show": "its jobs, their states and what each waits for",
        "cancel": "cancel its waiting and queued jobs, ask its running ones to stop",
        "retry": "bring back its dead and cancelled jobs, and what waited on them",
        "delete": "delete its jobs and their edges, once every job has ended",
    }
    for name, what in helps.items():
        sub = actions.add_parser(name, help=what)
        _database_option(sub)
        sub.add_argument("workflow_id", type=int, metavar="ID", help="the workflow's id")
        sub.add_argument("--json", action="store_true", help="JSON instead of text")
        if name == "retry":
            sub.add_argument(
                "--reset-attempts",
                action="store_true",
                help="count attempts from 0 again (default: keep them and raise max_attempts)",
            )
        if name == "delete":
            sub.add_argument(
                "--force",
                action="store_true",
                help="cancel and delete its waiting and queued jobs too (never running ones)",
            )


def _queues_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    queues_ = commands.add_parser("queues", help="list queues; pause, resume or limit one")
    actions = queues_.add_subparsers(dest="action", required=True)
    listing = actions.add_parser(
        "list", help="each queue: queued, due and running jobs, and what holds it back"
    )
    _database_option(listing)
    listing.add_argument("--json", action="store_true", help="JSON instead of a table")
    for name, what in (
        ("pause", "no worker starts the queue's jobs until it is resumed (running ones finish)"),
        ("resume", "workers take the queue's jobs again, woken at once"),
    ):
        sub = actions.add_parser(name, help=what)
        _database_option(sub)
        sub.add_argument("name", type=_values.queue, metavar="NAME", help="the queue")
    limit = actions.add_parser(
        "limit",
        help="cap how many of the queue's jobs run at once, or start per period, across all"
        " workers",
        description="Set or remove the queue's limits, for every worker, in one transaction;"
        " prints the new limits and the old. Give at least one option; --clear goes alone.",
    )
    _database_option(limit)
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


def _check_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    check_ = commands.add_parser("check", help="health checks: exit 0 ok, 1 warning, 2 critical")
    _database_option(check_)
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
