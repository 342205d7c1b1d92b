"""The ``sa-jobqueue`` command: run a worker, or install the schema.

    sa-jobqueue worker myapp.jobs:queue [--concurrency N] [--queues a,b] [--database-url URL]
    sa-jobqueue migrate [--database-url URL]

Errors a user can fix (wrong URL, unreachable server, missing schema, an app that does not
import) print one line on stderr and exit non-zero; they never dump a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from types import FrameType

from sqlalchemy import Engine

from .database import create_control_engine, create_engine, ping
from .errors import AppImportError, DatabaseUnavailableError, JobQueueError
from .queue import JobQueue
from .validation import check_queue_name

EXIT_ERROR = 1
EXIT_USAGE = 2


def load_app(spec: str) -> JobQueue:
    """Import ``module:attribute`` and return the JobQueue it names."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise AppImportError(f"expected module:attribute (e.g. myapp.jobs:queue), got {spec!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would: the app lives beside us
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise AppImportError(f"cannot import {module_name!r}: {type(exc).__name__}: {exc}") from exc
    try:
        app = getattr(module, attribute)
    except AttributeError:
        raise AppImportError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if not isinstance(app, JobQueue):
        raise AppImportError(f"{spec} is a {type(app).__name__}, not a sa_jobqueue.JobQueue")
    return app


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


def _queues(value: str) -> list[str]:
    try:
        return [check_queue_name(q.strip()) for q in value.split(",") if q.strip()]
    except JobQueueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sa-jobqueue", description="A job queue in your PostgreSQL database."
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
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
    worker.add_argument("--queues", type=_queues, help="comma-separated queues to serve")
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

    migrate = commands.add_parser("migrate", help="create or upgrade the sa_jobqueue tables")
    database_option(migrate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not args.database_url:
        print("sa-jobqueue: no database: pass --database-url or set DATABASE_URL", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.command == "migrate":
            return _migrate(args)
        return _worker(args)
    except JobQueueError as exc:
        print(f"sa-jobqueue: {exc}", file=sys.stderr)
        return EXIT_ERROR


def _migrate(args: argparse.Namespace) -> int:
    from .migrations import upgrade

    engine = create_engine(args.database_url)
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
    # One connection per handler thread; the worker's own statements use a second engine.
    engine = create_engine(args.database_url, pool_size=args.concurrency, max_overflow=2)
    control = create_control_engine(args.database_url, args.concurrency)
    _wait_for_database(control, args.wait_for_database)
    worker = Worker(
        app,
        engine,
        concurrency=args.concurrency,
        queues=args.queues,
        poll_interval=args.poll_interval,
        shutdown_grace=args.shutdown_grace,
        listen=args.listen,
        control_engine=control,
        prefetch=args.prefetch,
        retention=args.retention,
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
    clean = worker.run(burst=args.burst)
    engine.dispose()
    control.dispose()
    if not clean:
        logging.shutdown()
        os._exit(EXIT_ERROR)  # handler threads still running cannot be joined; do not wait
    return 0
