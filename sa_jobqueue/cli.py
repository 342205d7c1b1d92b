"""The ``sa-jobqueue`` command: run a worker, install the schema, and operate the queue.

    sa-jobqueue worker myapp.jobs:queue [--concurrency N] [--queues a,b | a=8,b=1]
                                        [--database-url URL]
    sa-jobqueue migrate [--database-url URL]
    sa-jobqueue stats [--json] [--watch SECONDS] [--window DURATION]
    sa-jobqueue jobs list|show|retry|cancel|purge [filters]
    sa-jobqueue check [--max-wait DURATION ...] [--json]
    sa-jobqueue verify [--jobs N] [--workers W] [--json] [--keep]
    sa-jobqueue --version

``--log-level`` and ``--log-format`` go before the subcommand or after it.

Errors a user can fix (wrong URL, unreachable server, missing schema, an app that does not
import) print one line on stderr and exit non-zero; they never dump a traceback, unless asked
for with ``--log-level DEBUG``. ``check`` exits 0 when all is well, 1 on a warning and 2 on a
critical finding (or when it cannot reach the database). Output cut short by its reader
(``| head``) ends the command quietly with status 141, as SIGPIPE ends other tools.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import signal
import sys
import sysconfig
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Final, Literal

from sqlalchemy import Connection, Engine, func, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from . import __version__
from ._validation import check_queue_name, check_task_name
from .database import POOLER_ENV, POOLERS, check_schema, create_control_engine, create_engine, ping
from .errors import AppImportError, DatabaseUnavailableError, JobQueueError
from .models import DEAD, FINISHED_STATUSES, RUNNING, STATUSES
from .observability import Observer
from .ops import count_purge, purge, stats
from .ops.health import Thresholds, check, span, worst
from .ops.jobs import MAX_PAGE
from .ops.reports import findings_json, findings_text, job_detail, job_list, stats_text, to_json
from .ops.verify.command import add_parser as add_verify_parser
from .ops.verify.command import run as run_verify
from .queue import JobQueue

if TYPE_CHECKING:
    from .observability.metrics import MetricsServer

EXIT_ERROR = 1
EXIT_USAGE = 2
#: The reader of our output went away (``sa-jobqueue jobs list --json | head``): 128 + SIGPIPE
#: (13), the status a shell shows for ``cat`` or ``grep`` ended that way.
EXIT_BROKEN_PIPE: Final = 141


def load_app(spec: str) -> JobQueue:
    """Import ``module:attribute`` and return the JobQueue it names.

    When the module raises while being imported (or does not parse), the AppImportError
    names the exception and the innermost line of the application's own code it came from,
    not a line in the standard library, an installed package or sa_jobqueue.
    """
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise AppImportError(f"expected module:attribute (e.g. myapp.jobs:queue), got {spec!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would: the app lives beside us
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        reason = exc.msg if isinstance(exc, SyntaxError) else str(exc)
        first = reason.strip().splitlines()[0] if reason.strip() else ""
        raise AppImportError(
            f"cannot import {module_name!r}: {type(exc).__name__}: {first}{_where(exc)}"
        ) from exc
    try:
        app = getattr(module, attribute)
    except AttributeError:
        raise AppImportError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if not isinstance(app, JobQueue):
        raise AppImportError(f"{spec} is a {type(app).__name__}, not a sa_jobqueue.JobQueue")
    return app


def _where(exc: BaseException) -> str:
    """`` (path, line N)`` of the application's line ``exc`` came from, or "" if none is."""
    if isinstance(exc, SyntaxError) and exc.filename and exc.lineno:
        return f" ({_shown(exc.filename)}, line {exc.lineno})"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if _is_application(f.filename)]
    return f" ({_shown(frames[-1].filename)}, line {frames[-1].lineno})" if frames else ""


def _is_application(filename: str) -> bool:
    """Whether ``filename`` is the user's code: not importlib's, a library's, or ours."""
    if filename.startswith("<"):  # <frozen importlib._bootstrap>, <string>
        return False
    return not os.path.realpath(filename).startswith(_LIBRARIES)


#: Where code that is not the application's lives: the standard library, installed packages
#: and sa_jobqueue itself (installed or, in development, a checkout); each ends in a separator.
_LIBRARIES: Final = tuple(
    {
        os.path.join(os.path.realpath(directory), "")
        for directory in (
            *(sysconfig.get_path(n) for n in ("stdlib", "platstdlib", "purelib", "platlib")),
            os.path.dirname(__file__),
        )
    }
)


def _shown(filename: str) -> str:
    """A path relative to the current directory when it is below it, as the user typed it."""
    path = Path(filename).resolve()
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _seconds(value: str) -> timedelta:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {value!r}") from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError("must be more than 0 seconds")
    return timedelta(seconds=seconds)


def _retention(value: str) -> timedelta | None:
    if value == "forever":
        return None
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {value!r}") from None
    if seconds < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return timedelta(seconds=seconds)


def _queues(value: str) -> list[tuple[str, int | None]]:
    """``a,b`` (sharing --concurrency) or ``emails=8,reports=1`` (a concurrency each)."""
    found: list[tuple[str, int | None]] = []
    for item in filter(None, (part.strip() for part in value.split(","))):
        name, sep, number = item.partition("=")
        try:
            queue = check_queue_name(name.strip())
        except JobQueueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if not sep:
            found.append((queue, None))
            continue
        try:
            concurrency = int(number)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a concurrency: {item!r}") from None
        if concurrency < 1:
            raise argparse.ArgumentTypeError(f"a queue's concurrency must be at least 1: {item!r}")
        found.append((queue, concurrency))
    return found


def _lanes(
    queues: list[tuple[str, int | None]] | None, concurrency: int
) -> list[str] | dict[str, int] | None:
    """The worker's ``queues``: a list sharing ``concurrency``, or a concurrency per queue.

    Once one queue names its concurrency, every queue gets threads of its own; a queue named
    without one gets ``--concurrency``.
    """
    if not queues:
        return None
    if all(n is None for _, n in queues):
        return [name for name, _ in queues]
    return {name: concurrency if n is None else n for name, n in queues}


LOG_FORMATS: Final = ("text", "json")
LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR")
#: The level when --log-level is not given. Alembic's own records are shown only when a level
#: is given (see _configure_logging).
DEFAULT_LOG_LEVEL: Final = "INFO"

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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sa-jobqueue", description="A job queue in your PostgreSQL database."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    def database_option(sub: argparse.ArgumentParser) -> None:
        sub.add_argument(
            "--database-url",
            default=os.environ.get("DATABASE_URL"),
            help="PostgreSQL URL (default: $DATABASE_URL)",
        )

    worker = commands.add_parser("worker", help="run a worker for the tasks of module:attribute")
    worker.add_argument("app", help="where your JobQueue lives, as module:attribute")
    database_option(worker)
    worker.add_argument("--concurrency", type=int, default=10, help="jobs run at once")
    worker.add_argument(
        "--queues",
        type=_queues,
        help="comma-separated queues to serve, sharing --concurrency (a,b), or each with its"
        " own threads (emails=8,reports=1)",
    )
    worker.add_argument(
        "--poll-interval",
        type=_seconds,
        default=timedelta(seconds=1),
        help="seconds between safety-net polls (default 1)",
    )
    worker.add_argument(
        "--shutdown-grace",
        type=_seconds,
        default=timedelta(seconds=30),
        help="seconds running jobs get to finish on SIGTERM (default 30)",
    )
    worker.add_argument(
        "--no-listen",
        dest="listen",
        action="store_false",
        help="poll only, no LISTEN (for PgBouncer in transaction mode)",
    )
    worker.add_argument(
        "--retention",
        type=_retention,
        default=timedelta(days=1),
        metavar="SECONDS",
        help="keep succeeded and cancelled jobs this long, 'forever' to keep them (default 1 day)",
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
        "--burst", action="store_true", help="exit once no job is due instead of waiting for more"
    )
    worker.add_argument(
        "--metrics-port",
        type=_port,
        metavar="PORT",
        help="serve Prometheus metrics on this port (needs the 'metrics' extra; 0: any free one)",
    )
    worker.add_argument(
        "--metrics-address",
        default="0.0.0.0",
        metavar="ADDRESS",
        help="address the metrics endpoint listens on (default 0.0.0.0, every interface)",
    )

    migrate = commands.add_parser("migrate", help="create or upgrade the sa_jobqueue tables")
    database_option(migrate)
    _operator_parsers(commands, database_option)
    add_verify_parser(commands, database_option)
    _add_global_options(parser)  # last: every subcommand exists by now
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``sa-jobqueue`` command with ``argv`` (default: the process's); its exit status."""
    try:
        try:
            return _main(argv)
        finally:
            # Flushed here: a reader that went away is seen now, in the handler below, rather
            # than as an "Exception ignored" message when the interpreter exits.
            sys.stdout.flush()
    except BrokenPipeError:
        # The reader stopped reading (`| head`): nothing went wrong. What is still buffered
        # goes to /dev/null, so that the interpreter's own flush at exit stays quiet.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE


def _main(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    _configure_logging(args.log_level, args.log_format)
    if not args.database_url:
        print("sa-jobqueue: no database: pass --database-url or set DATABASE_URL", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.command == "verify":
            return run_verify(args)  # exit 0 / 1 (lost or doubled) / 2 (could not run)
        if args.command == "migrate":
            return _migrate(args)
        if args.command in OPERATOR_COMMANDS:
            return _operate(args)
        return _worker(args)
    except JobQueueError as exc:
        if args.log_level == "DEBUG":
            traceback.print_exception(exc, file=sys.stderr)  # its cause's too, chained
        print(f"sa-jobqueue: {exc}", file=sys.stderr)
        return EXIT_ERROR


def _configure_logging(level: str | None, log_format: str) -> None:
    """Log to stderr at ``level``: text lines, or JSON objects with each record's fields.

    Alembic logs at INFO as it works (its plugins, each revision applied); those records are
    kept only when a level is given, so a plain ``sa-jobqueue migrate`` prints one line.
    """
    logging.getLogger("alembic").setLevel(level or "WARNING")
    handler = logging.StreamHandler()
    if log_format == "json":
        from .observability.logs import JsonFormatter

        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level or DEFAULT_LOG_LEVEL, handlers=[handler])


def _port(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {value!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError("must be from 0 to 65535")
    return port


def _migrate(args: argparse.Namespace) -> int:
    from .migrations import upgrade

    engine = create_engine(args.database_url, pooler=args.pooler)
    ping(engine)
    upgrade(engine)
    print("sa-jobqueue: schema is up to date")
    return 0


def _wait_for_database(engine: Engine, patience: float) -> None:
    """Ping until the database answers; give up with the last error after ``patience`` s."""
    deadline = time.monotonic() + patience
    delay = 0.5
    while True:
        try:
            ping(engine)
            return
        except DatabaseUnavailableError as exc:
            if time.monotonic() + delay > deadline:
                raise
            if delay == 0.5:
                print(f"sa-jobqueue: {exc}; retrying for up to {patience:g}s", file=sys.stderr)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def _worker(args: argparse.Namespace) -> int:
    from .worker import Worker

    if args.concurrency < 1 or (args.prefetch is not None and args.prefetch < 0):
        print(
            "sa-jobqueue: --concurrency must be at least 1, --prefetch at least 0", file=sys.stderr
        )
        return EXIT_USAGE
    app = load_app(args.app)
    queues = _lanes(args.queues, args.concurrency)
    threads = sum(queues.values()) if isinstance(queues, dict) else args.concurrency
    # One connection per handler thread; the worker's own statements use a second engine.
    engine = create_engine(args.database_url, pooler=args.pooler, pool_size=threads, max_overflow=2)
    control = create_control_engine(args.database_url, threads, pooler=args.pooler)
    _wait_for_database(control, args.wait_for_database)
    observers = _observers(args, app)
    metrics: MetricsServer | None = None
    if args.metrics_port is not None:
        metrics = _metrics_server(args, _queue_names(queues, app))
        observers.append(metrics.observer)
    worker = Worker(
        app,
        engine,
        concurrency=args.concurrency,
        queues=queues,
        poll_interval=args.poll_interval,
        shutdown_grace=args.shutdown_grace,
        listen=args.listen,
        control_engine=control,
        prefetch=args.prefetch,
        retention=args.retention,
        observers=observers,
    )

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if worker._stopping.is_set():
            # Second signal: leave now. Running jobs are reclaimed when their leases expire.
            logging.getLogger("sa_jobqueue.worker").warning("second signal: exiting at once")
            os._exit(128 + signum)
        logging.getLogger("sa_jobqueue.worker").info(
            "%s: finishing running jobs (up to %ss), then exiting",
            signal.Signals(signum).name,
            args.shutdown_grace.total_seconds(),
        )
        worker.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        clean = worker.run(burst=args.burst)
    finally:
        if metrics is not None:
            metrics.close()
    engine.dispose()
    control.dispose()
    if not clean:
        logging.shutdown()
        os._exit(EXIT_ERROR)  # handler threads still running cannot be joined; do not wait
    return 0


def _observers(args: argparse.Namespace, app: JobQueue) -> list[Observer]:
    """Job records in JSON logs or at DEBUG; a span per job if the app's queue traces.

    In text at INFO the worker's own lines already tell each failure, and every observer
    costs each job a little: the job records are left out there.
    """
    observers: list[Observer] = []
    if args.log_format == "json" or args.log_level == "DEBUG":
        from .observability.logs import LoggingObserver

        observers.append(LoggingObserver())
    if app.tracing:
        from .observability.tracing import TracingObserver

        observers.append(TracingObserver())
    return observers


def _queue_names(queues: list[str] | dict[str, int] | None, app: JobQueue) -> list[str]:
    """The queues whose depth the metrics report even when empty: the ones served."""
    if queues:
        return list(queues)
    return sorted({task.queue for task in app.tasks.values()} | {app.default_queue})


def _metrics_server(args: argparse.Namespace, queues: list[str]) -> MetricsServer:
    """Start the /metrics endpoint, reading queue depths through a connection of its own.

    Its engine lives as long as the process (a pool of one): a scrape never waits for a
    handler's or the claim loop's connection.
    """
    try:
        from .observability.metrics import start_metrics_server
    except ImportError as exc:
        raise JobQueueError(str(exc)) from None
    engine = create_engine(args.database_url, pooler=args.pooler, pool_size=1, max_overflow=0)
    try:
        return start_metrics_server(
            args.metrics_port, engine, addr=args.metrics_address, queues=queues
        )
    except OSError as exc:
        engine.dispose()
        raise JobQueueError(
            f"cannot serve metrics on {args.metrics_address}:{args.metrics_port}: {exc}"
        ) from None


# -- operating the queue: stats, jobs, check ---------------------------------------------------

OPERATOR_COMMANDS: Final = ("stats", "jobs", "check")
#: ``check``'s exit status by its worst finding (the convention of Nagios-style probes). An
#: unreachable database counts as critical; usage errors exit 2 too (argparse's status).
CHECK_EXIT: Final = {"ok": 0, "warning": 1, "critical": 2}
#: Limits for the operator commands' sessions: a query stuck behind a lock or on an overloaded
#: server fails instead of hanging a terminal or a monitoring probe.
OPERATOR_SETTINGS: Final = {"statement_timeout": "60s", "lock_timeout": "10s"}
#: Jobs requeued per transaction by ``jobs retry`` with filters.
RETRY_PAGE: Final = 500

_DURATION: Final = re.compile(r"(\d+(?:\.\d*)?|\.\d+)([smhd]?)")
_UNIT_SECONDS: Final = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration(value: str) -> timedelta:
    """``30s``, ``5m``, ``2h``, ``7d``, or a bare number of seconds; 0 is allowed."""
    match = _DURATION.fullmatch(value.strip().lower())
    if match is None:
        raise argparse.ArgumentTypeError(f"not a duration: {value!r} (e.g. 30s, 5m, 2h, 7d)")
    try:
        return timedelta(seconds=float(match[1]) * _UNIT_SECONDS[match[2]])
    except OverflowError:
        raise argparse.ArgumentTypeError(f"duration too long: {value!r}") from None


def _statuses(value: str) -> list[str]:
    wanted = [s.strip() for s in value.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in STATUSES]
    if unknown or not wanted:
        raise argparse.ArgumentTypeError(
            f"unknown status {', '.join(unknown) or '(none)'}: use {','.join(STATUSES)}"
        )
    return wanted


def _queue(value: str) -> str:
    try:
        return check_queue_name(value)
    except JobQueueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _task(value: str) -> str:
    try:
        return check_task_name(value)
    except JobQueueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _whole(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {value!r}") from None


def _page(value: str) -> int:
    number = _whole(value)
    if not 1 <= number <= MAX_PAGE:
        raise argparse.ArgumentTypeError(f"must be from 1 to {MAX_PAGE}")
    return number


def _count(value: str) -> int:
    number = _whole(value)
    if number < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return number


def _operator_parsers(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    database_option: Callable[[argparse.ArgumentParser], None],
) -> None:
    stats_ = commands.add_parser(
        "stats", help="jobs per queue and status, backlog age, run times, live workers"
    )
    database_option(stats_)
    stats_.add_argument("--json", action="store_true", help="JSON instead of tables")
    stats_.add_argument(
        "--watch", type=_seconds, metavar="SECONDS", help="print again every SECONDS until Ctrl-C"
    )
    stats_.add_argument(
        "--window",
        type=_duration,
        default=timedelta(minutes=10),
        metavar="DURATION",
        help="how far back finished jobs and run times are counted (default 10m)",
    )

    jobs = commands.add_parser("jobs", help="list, show, retry, cancel or purge jobs")
    actions = jobs.add_subparsers(dest="action", required=True)

    def filters(sub: argparse.ArgumentParser, age: str) -> None:
        sub.add_argument("--queue", type=_queue, help="only this queue")
        sub.add_argument("--task", type=_task, help="only this task")
        sub.add_argument(
            "--older-than", type=_duration, metavar="DURATION", help=f"only jobs {age} (7d, 2h)"
        )

    listing = actions.add_parser(
        "list", help="jobs in id order, oldest first unless --newest-first"
    )
    database_option(listing)
    filters(listing, "created longer ago than this")
    listing.add_argument("--status", type=_statuses, help="comma-separated statuses")
    listing.add_argument("--limit", type=_page, default=50, help="at most this many (default 50)")
    listing.add_argument("--after", type=int, metavar="ID", help="start after this id (next page)")
    listing.add_argument(
        "--newest-first",
        action="store_true",
        help="highest id first; --after then pages on to lower ids",
    )
    listing.add_argument("--json", action="store_true", help="JSON instead of a table")

    show = actions.add_parser("show", help="one job in full, its error's traceback included")
    database_option(show)
    show.add_argument("job_id", type=int, metavar="ID")
    show.add_argument("--json", action="store_true", help="JSON instead of text")

    retry = actions.add_parser("retry", help="put dead jobs back in their queues, due now")
    database_option(retry)
    retry.add_argument("job_ids", type=int, nargs="*", metavar="ID", help="the dead jobs")
    filters(retry, "created longer ago than this")
    retry.add_argument("--all", action="store_true", help="every dead job (no IDs, no filters)")
    retry.add_argument(
        "--reset-attempts",
        action="store_true",
        help="count attempts from 0 again (default: keep them and raise max_attempts)",
    )

    cancel = actions.add_parser("cancel", help="cancel queued jobs, ask running ones to stop")
    database_option(cancel)
    cancel.add_argument("job_ids", type=int, nargs="+", metavar="ID")

    purge_ = actions.add_parser("purge", help="delete finished jobs in batches")
    database_option(purge_)
    purge_.add_argument(
        "--status",
        type=_statuses,
        required=True,
        help="comma-separated, of succeeded, dead, cancelled (queued and running are refused)",
    )
    purge_.add_argument(
        "--older-than",
        type=_duration,
        required=True,
        metavar="DURATION",
        help="only jobs finished longer ago than this (7d, 2h; 0 for all)",
    )
    purge_.add_argument("--queue", type=_queue, help="only this queue")
    purge_.add_argument("--task", type=_task, help="only this task")
    purge_.add_argument(
        "--batch", type=_page, default=1000, help="rows per transaction (default 1000)"
    )
    purge_.add_argument("--dry-run", action="store_true", help="count them, delete nothing")

    check_ = commands.add_parser("check", help="health checks: exit 0 ok, 1 warning, 2 critical")
    database_option(check_)
    d = Thresholds()
    for option, default, what in (
        ("--max-wait", d.max_wait, "a due job waiting longer is a warning"),
        ("--lease-grace", d.lease_grace, "a lease expired longer ago, not reclaimed, is one"),
        ("--dead-window", d.dead_window, "how far back dead jobs are counted"),
        ("--max-transaction-age", d.max_transaction_age, "a transaction pinning xmin longer"),
        ("--stale-after", d.stale_after, "a worker not seen for longer is not live"),
    ):
        check_.add_argument(
            option,
            type=_duration,
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
            option, type=_count, default=number, metavar="N", help=f"{what} (default {number})"
        )
    check_.add_argument("--json", action="store_true", help="JSON instead of text")


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


def _operate(args: argparse.Namespace) -> int:
    if args.command == "check":
        return _check(args)
    engine = _operator_engine(args)
    try:
        ping(engine)
        check_schema(engine)
        if args.command == "stats":
            return _stats(engine, args)
        action: Callable[[Engine, argparse.Namespace], int] = {
            "list": _jobs_list,
            "show": _jobs_show,
            "retry": _jobs_retry,
            "cancel": _jobs_cancel,
            "purge": _jobs_purge,
        }[args.action]
        return action(engine, args)
    except DBAPIError as exc:
        print(f"sa-jobqueue: {_reason(exc)}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        engine.dispose()


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


def _now(conn: Connection) -> datetime:
    now: datetime = conn.execute(select(func.now())).scalar_one()
    return now


def _jobs_list(engine: Engine, args: argparse.Namespace) -> int:
    with engine.connect() as conn:
        found = JobQueue().list_jobs(
            conn,
            queue=args.queue,
            task=args.task,
            status=args.status,
            older_than=args.older_than,
            limit=args.limit,
            after_id=args.after,
            newest_first=args.newest_first,
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
        job = JobQueue().get_job(conn, args.job_id)
        now = _now(conn)
    if job is None:
        print(f"sa-jobqueue: no job with id {args.job_id}", file=sys.stderr)
        return EXIT_ERROR
    print(to_json(job) if args.json else job_detail(job, now))
    return 0


def _jobs_retry(engine: Engine, args: argparse.Namespace) -> int:
    queue = JobQueue()
    mode: Literal["extend", "reset"] = "reset" if args.reset_attempts else "extend"
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
                if queue.requeue(conn, job_id, attempts=mode):
                    print(f"job {job_id}: queued again")
                    continue
                failed += 1
                job = queue.get_job(conn, job_id)
                if job is None:
                    reason = "no such job"
                elif job.status != DEAD:
                    reason = f"not dead but {job.status}, left as it is"
                else:
                    reason = "left dead: a queued or running job of its task holds its unique key"
                print(f"sa-jobqueue: job {job_id}: {reason}", file=sys.stderr)
        return EXIT_ERROR if failed else 0
    requeued = kept = 0
    after: int | None = None
    while True:
        # A transaction per page: a long retry holds no locks for long, and what it did
        # stays done if it is interrupted.
        with engine.begin() as conn:
            page = queue.list_jobs(
                conn,
                status=DEAD,
                queue=args.queue,
                task=args.task,
                older_than=args.older_than,
                limit=RETRY_PAGE,
                after_id=after,
            )
            for job in page:
                if queue.requeue(conn, job.id, attempts=mode):
                    requeued += 1
                else:
                    kept += 1
        if len(page) < RETRY_PAGE:
            break
        after = page[-1].id
    print(f"requeued {requeued} dead job(s)")
    if kept:
        print(
            f"sa-jobqueue: {kept} left dead: a queued or running job of the task holds the"
            " unique key, or the job changed meanwhile",
            file=sys.stderr,
        )
        return EXIT_ERROR
    return 0


def _jobs_cancel(engine: Engine, args: argparse.Namespace) -> int:
    queue = JobQueue()
    failed = 0
    with engine.begin() as conn:
        for job_id in args.job_ids:
            if queue.cancel(conn, job_id):
                job = queue.get_job(conn, job_id)
                requested = job is not None and job.status == RUNNING
                print(
                    f"job {job_id}: "
                    + ("cancellation requested; its worker stops it" if requested else "cancelled")
                )
                continue
            failed += 1
            job = queue.get_job(conn, job_id)
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
