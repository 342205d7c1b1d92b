"""Prometheus metrics: counters and run times from the worker, queue depths from the database.

Needs ``prometheus-client`` (the ``metrics`` extra); nothing imports this module, and so
prometheus_client, unless metrics are asked for (``sa-jobqueue worker --metrics-port PORT``,
or :func:`start_metrics_server` in your own process)::

    server = start_metrics_server(9464, engine, queues=["default", "emails"])
    Worker(queue, engine, observers=[server.observer]).run()

What this worker did, from :class:`PrometheusObserver` (labels ``queue`` and ``task``):

* ``sa_jobqueue_jobs_started_total``: attempts whose handler started;
* ``sa_jobqueue_jobs_finished_total{outcome}``: attempts by recorded outcome (succeeded,
  retried, dead, cancelled, lost, handed_back), every outcome present from the first job;
* ``sa_jobqueue_job_run_seconds``: a histogram of handler run times, 1 ms to 10 min;
* ``sa_jobqueue_lease_losses_total``: attempts whose lease was taken over while they ran.

What the queue holds, from :class:`QueueCollector`, read from the database at each scrape:

* ``sa_jobqueue_queue_jobs{queue,status}``: queued and running jobs;
* ``sa_jobqueue_queue_due_jobs{queue}``: queued jobs whose time has come (the backlog);
* ``sa_jobqueue_queue_oldest_due_age_seconds{queue}``: how long the oldest of them has waited;
* ``sa_jobqueue_queue_paused{queue}``: 1 while the queue is paused, else 0;
* ``sa_jobqueue_queue_concurrency_limit{queue}``: the queue's cap (jobs running at once across
  all workers), only for queues with one;
* ``sa_jobqueue_queue_rate_limit{queue}``: the queue's rate limit in job starts per second
  (``50/1m`` is 0.833...), only for queues with one;
* ``sa_jobqueue_queue_key_concurrency_limit{queue}`` and
  ``sa_jobqueue_queue_key_rate_limit{queue}``: the same per key (jobs of one task with the same
  value of the payload's key field), only for queues with them;
* ``sa_jobqueue_scrape_errors_total``: scrapes whose database query failed.

Every worker reports the same queue gauges: aggregate them with ``max by (queue)``, not
``sum``. The counters are per process; ``sum`` them.

What is not promised: queue gauges at every scrape. The query has a time limit (default 2 s)
and runs at most once per ``min_interval`` (default 5 s; scrapes in between get the same
figures). When it fails, that scrape has no queue gauges and the error counter goes up; the
worker's own metrics are always there. Finished jobs are not counted (their table may hold
millions of rows); ``sa-jobqueue stats`` and ``check`` read them on demand.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final
from wsgiref.simple_server import WSGIServer

try:
    from prometheus_client import (
        CollectorRegistry,
        Counter,
        Histogram,
        PlatformCollector,
        ProcessCollector,
        start_http_server,
    )
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "sa_jobqueue's metrics need prometheus-client: pip install 'sa_jobqueue[metrics]'"
    ) from exc

from sqlalchemy import Engine

from .._error_text import one_line
from .._sql.queues import all_limits, paused_queues
from .._sql.session import local_statement_timeout
from .._sql.stats import live_per_queue
from ..models import QUEUED, RUNNING
from ._observer import OUTCOMES, JobRun, Observer

log = logging.getLogger("sa_jobqueue.metrics")

#: Run-time histogram buckets (seconds): 1-2.5-5 steps from 1 ms to 10 s, then 30 s, 1, 2, 5
#: and 10 minutes. Eighteen buckets: fine for short jobs, still useful for long ones.
RUN_TIME_BUCKETS: Final = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
)


@dataclass(frozen=True, slots=True)
class _Series:
    """One (queue, task)'s children of each metric: ``labels()`` costs a lock and a lookup."""

    started: Counter
    finished: dict[str, Counter]
    run_time: Histogram
    lease_lost: Counter


class PrometheusObserver(Observer):
    """Counts each attempt's start, outcome, run time and lost lease, per queue and task.

    Its metrics live in ``registry`` (default: a new private one, exposed by
    :func:`start_metrics_server`; pass ``prometheus_client.REGISTRY`` to join your app's).
    Each hook costs a dictionary lookup and an increment under prometheus_client's lock.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        buckets: Sequence[float] = RUN_TIME_BUCKETS,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        labels = ("queue", "task")
        self._started = Counter(
            "sa_jobqueue_jobs_started",
            "Attempts whose handler started.",
            labels,
            registry=self.registry,
        )
        self._finished = Counter(
            "sa_jobqueue_jobs_finished",
            "Attempts whose outcome was recorded, by outcome.",
            (*labels, "outcome"),
            registry=self.registry,
        )
        self._run_time = Histogram(
            "sa_jobqueue_job_run_seconds",
            "Run time of each attempt's handler.",
            labels,
            buckets=buckets,
            registry=self.registry,
        )
        self._lease_lost = Counter(
            "sa_jobqueue_lease_losses",
            "Attempts whose lease was taken over while their handler ran.",
            labels,
            registry=self.registry,
        )
        self._series: dict[tuple[str, str], _Series] = {}
        self._lock = threading.Lock()

    def _of(self, job: JobRun) -> _Series:
        series = self._series.get((job.queue, job.task))
        if series is None:
            with self._lock:
                series = self._series.get((job.queue, job.task))
                if series is None:
                    labels = (job.queue, job.task)
                    series = _Series(
                        started=self._started.labels(*labels),
                        # Every outcome from the start, at 0: rate() needs the series to exist
                        # before its first increment.
                        finished={o: self._finished.labels(*labels, o) for o in OUTCOMES},
                        run_time=self._run_time.labels(*labels),
                        lease_lost=self._lease_lost.labels(*labels),
                    )
                    self._series[job.queue, job.task] = series
        return series

    def started(self, job: JobRun) -> None:
        self._of(job).started.inc()

    def finished(
        self, job: JobRun, outcome: str, run_time: float | None, error: BaseException | None
    ) -> None:
        series = self._of(job)
        counter = series.finished.get(outcome)
        if counter is None:  # an outcome this module does not know yet
            counter = self._finished.labels(job.queue, job.task, outcome)
        counter.inc()
        if run_time is not None:
            series.run_time.observe(run_time)

    def lease_lost(self, job: JobRun) -> None:
        self._of(job).lease_lost.inc()


class QueueCollector:
    """Queue depths from the database, read when Prometheus scrapes (a custom collector).

    ``queues`` are always reported, at 0 when empty; other queues with live jobs are reported
    too. The query runs in a transaction of its own on ``engine`` with a ``statement_timeout``
    of ``timeout``, at most once per ``min_interval``. It never raises into the scrape: a
    failure is logged (once, until it works again) and counted.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        queues: Iterable[str] = (),
        timeout: timedelta = timedelta(seconds=2),
        min_interval: timedelta = timedelta(seconds=5),
    ) -> None:
        # A real transaction, whatever the engine's isolation level: SET LOCAL needs one.
        self._engine = engine.execution_options(isolation_level="READ COMMITTED")
        self.queues = list(queues)
        self._timeout_ms = str(max(1, round(timeout.total_seconds() * 1000)))
        self._min_interval = min_interval.total_seconds()
        self._lock = threading.Lock()  # one query at a time, whoever scrapes
        self._rows: tuple[list[Any], set[str], list[Any]] | None = None
        self._read_at = 0.0
        self._errors = 0
        self._failing = False

    def describe(self) -> Iterable[Metric]:
        """The metric families, without samples: the registry checks names without a query."""
        return list(self._families())

    def collect(self) -> Iterable[Metric]:
        jobs, due, age, paused, cap, rate, key_cap, key_rate, errors = self._families()
        read = self._read()
        if read is not None:
            rows, paused_now, limits = read
            seen = set()
            for queue, queued, due_now, running, oldest in rows:
                seen.add(queue)
                jobs.add_metric([queue, QUEUED], queued)
                jobs.add_metric([queue, RUNNING], running)
                due.add_metric([queue], due_now)
                age.add_metric([queue], 0.0 if oldest is None else oldest.total_seconds())
            for queue in self.queues:
                if queue not in seen:
                    jobs.add_metric([queue, QUEUED], 0)
                    jobs.add_metric([queue, RUNNING], 0)
                    due.add_metric([queue], 0)
                    age.add_metric([queue], 0.0)
            for queue in sorted(seen | set(self.queues) | paused_now):
                paused.add_metric([queue], 1 if queue in paused_now else 0)
            # No series for a queue without the limit: 0 would read as "none may run".
            for queue, concurrency, count, period, _, per_key, _, key_count, key_period in limits:
                if concurrency is not None:
                    cap.add_metric([queue], concurrency)
                if count is not None:
                    rate.add_metric([queue], count / period.total_seconds())
                if per_key is not None:
                    key_cap.add_metric([queue], per_key)
                if key_count is not None:
                    key_rate.add_metric([queue], key_count / key_period.total_seconds())
        errors.add_metric([], self._errors)
        if read is None:
            return [errors]
        return [jobs, due, age, paused, cap, rate, key_cap, key_rate, errors]

    def _families(
        self,
    ) -> tuple[
        GaugeMetricFamily,
        GaugeMetricFamily,
        GaugeMetricFamily,
        GaugeMetricFamily,
        GaugeMetricFamily,
        GaugeMetricFamily,
        GaugeMetricFamily,
        GaugeMetricFamily,
        CounterMetricFamily,
    ]:
        return (
            GaugeMetricFamily(
                "sa_jobqueue_queue_jobs",
                "Queued and running jobs, per queue and status.",
                labels=["queue", "status"],
            ),
            GaugeMetricFamily(
                "sa_jobqueue_queue_due_jobs",
                "Queued jobs whose time has come, per queue.",
                labels=["queue"],
            ),
            GaugeMetricFamily(
                "sa_jobqueue_queue_oldest_due_age_seconds",
                "How long the oldest due job of each queue has waited (0 if none).",
                labels=["queue"],
            ),
            GaugeMetricFamily(
                "sa_jobqueue_queue_paused",
                "1 while the queue is paused (its jobs do not start), else 0.",
                labels=["queue"],
            ),
            GaugeMetricFamily(
                "sa_jobqueue_queue_concurrency_limit",
                "The queue's cap: at most this many of its jobs run at once, across all workers.",
                labels=["queue"],
            ),
            GaugeMetricFamily(
                "sa_jobqueue_queue_rate_limit",
                "The queue's rate limit, in job starts per second, across all workers.",
                labels=["queue"],
            ),
            GaugeMetricFamily(
                "sa_jobqueue_queue_key_concurrency_limit",
                "The queue's cap per key: at most this many jobs of one task with one key run"
                " at once.",
                labels=["queue"],
            ),
            GaugeMetricFamily(
                "sa_jobqueue_queue_key_rate_limit",
                "The queue's rate per key, in job starts per second for each key.",
                labels=["queue"],
            ),
            CounterMetricFamily(
                "sa_jobqueue_scrape_errors",
                "Scrapes whose queue query failed (no queue gauges in that scrape).",
                labels=[],
            ),
        )

    def _read(self) -> tuple[list[Any], set[str], list[Any]] | None:
        with self._lock:
            if self._rows is not None and time.monotonic() - self._read_at < self._min_interval:
                return self._rows
            try:
                with self._engine.begin() as conn:
                    conn.execute(local_statement_timeout(), {"timeout_ms": self._timeout_ms})
                    rows = list(conn.execute(live_per_queue()).all())
                    paused = set(conn.execute(paused_queues()).scalars())
                    limits = list(conn.execute(all_limits()).all())
            except Exception as exc:  # the database, the network, the pool: never the scrape
                self._errors += 1
                self._rows = None
                if not self._failing:
                    log.warning("queue metrics: the database query failed: %s", one_line(exc))
                self._failing = True
                return None
            if self._failing:
                log.info("queue metrics: the database query works again")
            self._failing = False
            self._rows, self._read_at = (rows, paused, limits), time.monotonic()
            return self._rows


class MetricsServer:
    """A running ``/metrics`` endpoint; give ``observer`` to the worker, ``close()`` at the end."""

    def __init__(
        self, observer: PrometheusObserver, server: WSGIServer, thread: threading.Thread
    ) -> None:
        self.observer = observer
        self.registry = observer.registry
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


def start_metrics_server(
    port: int,
    engine: Engine | None = None,
    *,
    addr: str = "0.0.0.0",
    queues: Iterable[str] = (),
    registry: CollectorRegistry | None = None,
    stats_timeout: timedelta = timedelta(seconds=2),
    stats_interval: timedelta = timedelta(seconds=5),
) -> MetricsServer:
    """Serve Prometheus metrics on ``addr:port`` (prometheus_client's server, a daemon thread).

    The registry holds a :class:`PrometheusObserver`'s metrics and, with ``engine``, a
    :class:`QueueCollector` over it (``queues``, ``stats_timeout``, ``stats_interval``). A new
    private registry also gets the process and platform collectors (CPU, memory, file
    descriptors, Python version). Raises OSError if the port is taken.
    """
    private = registry is None
    observer = PrometheusObserver(registry)
    if private:
        ProcessCollector(registry=observer.registry)
        PlatformCollector(registry=observer.registry)
    if engine is not None:
        observer.registry.register(
            QueueCollector(
                engine, queues=queues, timeout=stats_timeout, min_interval=stats_interval
            )
        )
    server, thread = start_http_server(port, addr, registry=observer.registry)
    log.info("serving metrics on http://%s:%d/metrics", addr, server.server_port)
    return MetricsServer(observer, server, thread)
