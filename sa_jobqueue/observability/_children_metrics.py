"""The supervisor's one ``/metrics`` endpoint: every child's counters, and the queue gauges.

Needs ``prometheus-client`` (imported by the supervisor only when asked for metrics). Each
child's :class:`~sa_jobqueue.observability.metrics.PrometheusObserver` writes its values to
files in ``directory`` (prometheus_client's multiprocess mode: the supervisor sets
``PROMETHEUS_MULTIPROC_DIR`` for its children); a scrape adds them up with
prometheus_client's ``MultiProcessCollector``. The children export counters and a histogram
only, which add up across processes, including those of children that have exited, so a
restart never makes a counter go back. The queue gauges are read by the supervisor, once per
scrape (not once per child), with :class:`~sa_jobqueue.observability.metrics.QueueCollector`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from datetime import timedelta
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.multiprocess import MultiProcessCollector
from sqlalchemy import Engine

from .metrics import QueueCollector

log = logging.getLogger("sa_jobqueue.metrics")


class ChildrenMetricsServer:
    """A running endpoint; ``close()`` it when the supervisor ends."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread

    @property
    def port(self) -> int:
        """The port it listens on (the one the OS chose, if started with port 0)."""
        return int(self._server.server_port)

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def start_children_metrics_server(
    directory: str,
    port: int,
    engine: Engine | None = None,
    *,
    addr: str = "0.0.0.0",
    queues: Iterable[str] = (),
    stats_timeout: timedelta = timedelta(seconds=2),
    stats_interval: timedelta = timedelta(seconds=5),
) -> ChildrenMetricsServer:
    """Serve the sum of the children's metrics in ``directory`` and, with ``engine``, the queues'.

    Raises OSError if the port is taken.
    """
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
    if engine is not None:
        registry.register(
            QueueCollector(
                engine, queues=queues, timeout=stats_timeout, min_interval=stats_interval
            )
        )
    server, thread = start_http_server(port, addr, registry=registry)
    port = int(server.server_port)
    log.info(
        "serving the worker processes' metrics on http://%s:%d/metrics", addr, server.server_port
    )
    return ChildrenMetricsServer(server, thread)
