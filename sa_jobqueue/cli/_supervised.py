"""``sa-jobqueue worker --processes N``: a supervisor whose children are ``worker`` commands.

The supervisor (:class:`sa_jobqueue.worker.Supervisor`) loads the app and checks the
database and its schema once, so that a typo or a missing migration is one line and status 1,
not a crash loop; each child then builds its worker from the same options
(:func:`child_worker`). With ``--metrics-port``, the supervisor serves the one endpoint.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..database import check_schema, create_control_engine, create_engine
from ..errors import JobQueueError
from ..observability import Observer
from ._app import load_app
from ._exit import EXIT_USAGE
from ._logs import configure_logging
from ._worker import _queue_names, _wait_for_database, build_worker, served, usable

if TYPE_CHECKING:
    from ..worker import Worker


def supervised(args: argparse.Namespace) -> bool:
    """Whether the options ask for a supervisor: ``--processes`` or ``--max-*-per-child``."""
    return (
        args.processes is not None
        or args.max_jobs_per_child is not None
        or args.max_memory_per_child is not None
    )


def supervise(args: argparse.Namespace) -> int:
    """Run ``--processes`` workers under a supervisor; its exit status."""
    from ..worker import Supervisor

    processes = args.processes
    if not usable(args):
        return EXIT_USAGE
    if processes is None:
        print(
            "sa-jobqueue: --max-jobs-per-child and --max-memory-per-child need --processes",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.health_port is not None:
        # Each child would bind the same port, and the supervisor's own liveness is not its
        # children's: refused rather than served wrong.
        print(
            "sa-jobqueue: --health-port serves one worker's probes; it does not go with"
            " --processes (run one worker per container, or probe the metrics endpoint)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    for option, value in (
        ("--processes", processes),
        ("--max-jobs-per-child", args.max_jobs_per_child),
        ("--max-memory-per-child", args.max_memory_per_child),
    ):
        if value is not None and value < 1:
            print(f"sa-jobqueue: {option} must be at least 1", file=sys.stderr)
            return EXIT_USAGE
    app = load_app(args.app)
    control = create_control_engine(args.database_url, 1, pooler=args.pooler)
    metrics_engine = None
    try:
        _wait_for_database(control, args.wait_for_database)
        check_schema(control)
        control.dispose()  # the supervisor holds no connection of its own while it runs
        if args.metrics_port is not None:
            try:
                import prometheus_client  # noqa: F401  (the 'metrics' extra, only when asked)
            except ImportError:
                raise JobQueueError(
                    "sa_jobqueue's metrics need prometheus-client:"
                    " pip install 'sa_jobqueue[metrics]'"
                ) from None
            # A pool of one for the queue gauges: the supervisor's only connection.
            metrics_engine = create_engine(
                args.database_url, pooler=args.pooler, pool_size=1, max_overflow=0
            )
        supervisor = Supervisor(
            functools.partial(child_worker, args),
            processes=processes,
            burst=args.burst,
            max_jobs_per_child=args.max_jobs_per_child,
            max_memory_per_child=args.max_memory_per_child,
            shutdown_grace=args.shutdown_grace,
            metrics_port=args.metrics_port,
            metrics_address=args.metrics_address,
            metrics_engine=metrics_engine,
            metrics_queues=_queue_names(served(args), app),
        )
        return supervisor.run()
    finally:
        control.dispose()
        if metrics_engine is not None:
            metrics_engine.dispose()


def child_worker(args: argparse.Namespace, observers: Sequence[Observer]) -> Worker:
    """In a child: the worker of ``sa-jobqueue worker`` with these options, and its logging."""
    configure_logging(args.log_level, args.log_format)
    worker = build_worker(args, load_app(args.app), observers)
    return worker
