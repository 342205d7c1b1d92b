"""``sa-jobqueue worker``: its options; load the app, build the Worker with its observers, run it.

SIGTERM and SIGINT ask the worker to finish its running jobs (up to ``--shutdown-grace``)
and exit; a second signal exits at once, leaving running jobs to be reclaimed when their
leases expire. A worker that could not stop cleanly exits with status 1 without waiting for
handler threads that are still running.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Final

from sqlalchemy import Engine
from sqlalchemy.pool import NullPool

from ..database import CONNECT_TIMEOUT, create_engine, ping, pooler_of
from ..errors import DatabaseUnavailableError, JobQueueError
from ..observability import Observer
from ..queue import JobQueue
from . import _values
from ._app import load_app
from ._exit import EXIT_ERROR, EXIT_USAGE

if TYPE_CHECKING:
    from ..observability.health import HealthServer
    from ..observability.metrics import MetricsServer
    from ..worker import Worker


#: The worker's queues when no --queues is given: for lists a command line cannot hold.
QUEUES_ENV: Final = "SA_JOBQUEUE_QUEUES"


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    database_option: Callable[[argparse.ArgumentParser], None],
) -> None:
    """Declare ``sa-jobqueue worker`` and its options (``--processes`` and the
    ``--max-*-per-child`` ask for :mod:`._supervised`)."""
    worker = commands.add_parser("worker", help="run a worker for the tasks of module:attribute")
    worker.add_argument("app", help="where your JobQueue lives, as module:attribute")
    database_option(worker)
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


def run_worker(args: argparse.Namespace) -> int:
    """Run a worker until it is stopped (or, with ``--burst``, until it can start nothing more)."""
    if not usable(args):
        return EXIT_USAGE
    from ..worker._signals import exit_by, relayed

    app = load_app(args.app)
    metrics: MetricsServer | None = None
    if args.metrics_port is not None:
        metrics = _metrics_server(args, _queue_names(served(args), app))
    try:
        worker = build_worker(args, app, [metrics.observer] if metrics else [])
    except BaseException:
        if metrics is not None:
            metrics.close()
        raise
    health = None if args.health_port is None else _health_server(args, worker)

    def on_signal(signum: int) -> None:
        if worker._stopping.is_set():
            # Second signal: leave now. Running jobs are reclaimed when their leases expire.
            logging.getLogger("sa_jobqueue.worker").warning("second signal: exiting at once")
            os._exit(128 + signum)
        logging.getLogger("sa_jobqueue.worker").info(
            "%s: finishing running jobs (up to %ss), then exiting",
            signal.Signals(signum).name,
            args.shutdown_grace.total_seconds(),
        )
        exit_by(worker._stop_seconds)
        worker.stop()

    try:
        with relayed((signal.SIGTERM, signal.SIGINT), on_signal):
            clean = worker.run(burst=args.burst)  # disposes of the worker's engines as it returns
    finally:
        if metrics is not None:
            metrics.close()
        if health is not None:
            health.close()
    if not clean:
        logging.shutdown()
        os._exit(EXIT_ERROR)  # handler threads still running cannot be joined; do not wait
    return 0


def usable(args: argparse.Namespace) -> bool:
    """Whether the worker's numbers are in range; if not, one line on stderr says which."""
    if args.concurrency < 1 or (args.prefetch is not None and args.prefetch < 0):
        print(
            "sa-jobqueue: --concurrency must be at least 1, --prefetch at least 0", file=sys.stderr
        )
        return False
    return True


def build_worker(args: argparse.Namespace, app: JobQueue, extra: Sequence[Observer]) -> Worker:
    """The worker the options ask for, with its engines (see ``Worker.from_url``: the worker
    owns them), once the database answers.

    ``extra`` observers come after the command's own (the metrics, a supervisor's recycler).
    """
    from ..worker import Worker

    # The engines as an application embedding a worker gets them (one way to build them).
    worker = Worker.from_url(
        args.database_url,
        app,
        pooler=args.pooler,
        concurrency=args.concurrency,
        queues=served(args),
        poll_interval=args.poll_interval,
        shutdown_grace=args.shutdown_grace,
        listen=args.listen,
        prefetch=args.prefetch,
        retention=args.retention,
        observers=[*_observers(args, app), *extra],
    )
    _wait_for_database(worker.control_engine, args.wait_for_database)
    return worker


def served(args: argparse.Namespace) -> list[str] | dict[str, int] | None:
    """The worker's ``queues``, from ``--queues`` and ``--queues-file`` (see :func:`lanes`)."""
    return lanes((args.queues or []) + (args.queues_file or []), args.concurrency)


def lanes(
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


def _wait_for_database(engine: Engine, patience: float) -> None:
    """Ping until the database answers; give up with the last error after ``patience`` s.

    Each try connects afresh with a connect timeout of at most half the patience left (and
    libpq's 2 s at least), so that one connection that hangs (its handshake gone silent, a
    server too busy to answer it) cannot use up the whole wait on its own.
    """
    deadline = time.monotonic() + patience
    delay = 0.5
    while True:
        left = deadline - time.monotonic()
        try:
            _ping_once(engine, connect_timeout=max(2, min(CONNECT_TIMEOUT, int(left / 2))))
            return
        except DatabaseUnavailableError as exc:
            if time.monotonic() + delay > deadline:
                raise
            if delay == 0.5:
                print(f"sa-jobqueue: {exc}; retrying for up to {patience:g}s", file=sys.stderr)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def _ping_once(engine: Engine, connect_timeout: int) -> None:
    """:func:`ping` over a connection of its own, made with ``engine``'s URL and pooler."""
    once = create_engine(
        engine.url,
        pooler=pooler_of(engine),
        poolclass=NullPool,
        connect_args={"connect_timeout": connect_timeout},
    )
    try:
        ping(once)
    finally:
        once.dispose()


def _observers(args: argparse.Namespace, app: JobQueue) -> list[Observer]:
    """Job records in JSON logs or at DEBUG; a span per job if the app's queue traces.

    In text at INFO the worker's own lines already tell each failure, and every observer
    costs each job a little: the job records are left out there.
    """
    observers: list[Observer] = []
    if args.log_format == "json" or args.log_level == "DEBUG":
        from ..observability.logs import LoggingObserver

        observers.append(LoggingObserver())
    if app.tracing:
        from ..observability.tracing import TracingObserver

        observers.append(TracingObserver())
    return observers


def _queue_names(queues: list[str] | dict[str, int] | None, app: JobQueue) -> list[str]:
    """The queues whose depth the metrics report even when empty: the ones served by name (a
    pattern names no one queue)."""
    if queues:
        return [name for name in queues if not any(c in name for c in "*?")]
    return sorted({task.queue for task in app.tasks.values()} | {app.default_queue})


def _metrics_server(args: argparse.Namespace, queues: list[str]) -> MetricsServer:
    """Start the /metrics endpoint, reading queue depths through a connection of its own.

    Its engine lives as long as the process (a pool of one): a scrape never waits for a
    handler's or the claim loop's connection.
    """
    try:
        from ..observability.metrics import start_metrics_server
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


def _health_server(args: argparse.Namespace, worker: Worker) -> HealthServer:
    """Start the /livez and /readyz endpoint, its readiness query on a connection of its own
    (a pool of one, connecting within 2 s: a probe never waits behind the worker's)."""
    from ..observability.health import start_health_server

    engine = create_engine(
        args.database_url,
        pooler=args.pooler,
        pool_size=1,
        max_overflow=0,
        pool_pre_ping=False,  # the probe's query is the ping
        connect_args={"connect_timeout": 2},
    )
    try:
        return start_health_server(
            args.health_port, worker, engine, addr=args.health_address,
            stalled_after=args.stalled_after,
        )  # fmt: skip
    except OSError as exc:
        engine.dispose()
        raise JobQueueError(
            f"cannot serve probes on {args.health_address}:{args.health_port}: {exc}"
        ) from None
