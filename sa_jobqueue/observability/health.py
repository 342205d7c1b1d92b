"""Liveness and readiness probes for a worker: ``/livez`` and ``/readyz`` over plain HTTP.

For orchestrators (Kubernetes' ``livenessProbe`` and ``readinessProbe``, a load balancer's
health check, a script): ``sa-jobqueue worker --health-port PORT`` serves them, or
:func:`start_health_server` in your own process. The standard library's HTTP server, on a
daemon thread; no extra is needed.

* ``GET /livez``: 200 while the worker's claim loop and heartbeat each went round within
  ``stalled_after`` (see :meth:`sa_jobqueue.Worker.stalled`), 503 naming the stalled loop
  otherwise. Also 200 before the loops start and while the worker stops (its claim loop is
  then over by design). A database that does not answer does not fail it: the loops go on
  retrying, and restarting the process would not help.
* ``GET /readyz``: 200 while the database answers ``SELECT 1`` within ``timeout``, 503 with
  the reason otherwise, and 503 once the worker is stopping. The answer is kept for
  ``cache_for``: probes that come more often reuse it instead of querying again.

What is not promised: that a 200 from ``/livez`` means jobs run (a paused queue, a cap, an
empty queue all leave a live worker idle), or that a 200 from ``/readyz`` means the schema
is current (the worker checks that once, at start). The bodies are one line of text for
people, not a format to parse: read the status code.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

from sqlalchemy import Engine

from .._deadlines import guard_statements
from .._error_text import one_line
from .._sql.session import ping

if TYPE_CHECKING:
    from ..worker import Worker

log = logging.getLogger("sa_jobqueue.health")


class Readiness:
    """Whether the database answers ``SELECT 1`` within ``timeout``; answers kept ``cache_for``.

    The query runs on ``engine`` (give it a pool of its own, one connection is enough, so a
    probe never waits behind the worker's connections) under a client-side deadline of
    ``timeout``: a server or network gone silent fails the probe in time instead of hanging
    it. One query at a time, whoever asks.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        timeout: timedelta = timedelta(seconds=2),
        cache_for: timedelta = timedelta(seconds=2),
    ) -> None:
        self._engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        guard_statements(self._engine, seconds=timeout.total_seconds())
        self._cache_for = cache_for.total_seconds()
        self._lock = threading.Lock()
        self._answer: str | None = None
        self._asked_at = float("-inf")

    def problem(self) -> str | None:
        """None if the database answered; else why not, in one line."""
        with self._lock:
            if time.monotonic() - self._asked_at < self._cache_for:
                return self._answer
            try:
                with self._engine.connect() as conn:
                    conn.execute(ping())
                answer = None
            except Exception as exc:  # the database, the network, the pool: a 503, not a crash
                answer = f"the database does not answer: {one_line(exc)}"
            if answer != self._answer:
                (log.warning if answer else log.info)("readiness: %s", answer or "ready again")
            self._answer, self._asked_at = answer, time.monotonic()
            return answer


class HealthServer:
    """A running probe endpoint (``/livez``, ``/readyz``); ``close()`` it at the end."""

    def __init__(self, server: ThreadingHTTPServer, thread: threading.Thread) -> None:
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


def start_health_server(
    port: int,
    worker: Worker,
    engine: Engine,
    *,
    addr: str = "0.0.0.0",
    stalled_after: timedelta | None = None,
    timeout: timedelta = timedelta(seconds=2),
    cache_for: timedelta = timedelta(seconds=2),
) -> HealthServer:
    """Serve ``/livez`` and ``/readyz`` for ``worker`` on ``addr:port``, on a daemon thread.

    ``/readyz`` queries over ``engine`` (see :class:`Readiness`: ``timeout``, ``cache_for``);
    ``/livez`` reads ``worker.stalled(stalled_after)``. Raises OSError if the port is taken.
    """
    readiness = Readiness(engine, timeout=timeout, cache_for=cache_for)

    def livez() -> tuple[HTTPStatus, str]:
        stalled = worker.stalled(stalled_after)
        if not stalled:
            return HTTPStatus.OK, "alive"
        turns = ", ".join(f"{loop}: no turn for {age:.1f} s" for loop, age in stalled.items())
        return HTTPStatus.SERVICE_UNAVAILABLE, f"stalled ({turns})"

    def readyz() -> tuple[HTTPStatus, str]:
        if worker.stopping:
            return HTTPStatus.SERVICE_UNAVAILABLE, "stopping"
        problem = readiness.problem()
        if problem is not None:
            return HTTPStatus.SERVICE_UNAVAILABLE, problem
        return HTTPStatus.OK, "ready"

    routes = {"/livez": livez, "/readyz": readyz}

    class Probe(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            route = routes.get(self.path.split("?", 1)[0])
            status, text = route() if route else (HTTPStatus.NOT_FOUND, "not found")
            body = (text + "\n").encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("probe: " + format, *args)  # a probe every few seconds: not at INFO

    server = ThreadingHTTPServer((addr, port), Probe)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="sa_jobqueue-health", daemon=True)
    thread.start()
    log.info("serving probes on http://%s:%d/livez and /readyz", addr, server.server_port)
    return HealthServer(server, thread)
