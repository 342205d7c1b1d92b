"""OpenTelemetry tracing: each job remembers the trace that enqueued it; each run gets a span.

Needs ``opentelemetry-api`` (the ``tracing`` extra); nothing imports this module, and so
OpenTelemetry, unless tracing is asked for. One switch turns on both ends::

    queue = JobQueue(tracing=True)

* **Enqueue.** ``enqueue``, ``enqueue_many`` and their async variants store the current
  context, as the global propagator writes it (W3C ``traceparent``/``tracestate`` and
  ``baggage`` by default; ``OTEL_PROPAGATORS`` changes it), in the row's ``trace_context``.
  No span is current (no trace, or no SDK configured): nothing is stored, and the INSERT is
  the one tracing off would send. Enqueue opens no span of its own: the job points back to
  the caller's span, such as the web request that enqueued it.
* **Run.** :class:`TracingObserver` wraps each attempt's handler in a ``CONSUMER`` span,
  ``sa_jobqueue run <task>``, current while the handler runs, so the handler's own spans
  (database, HTTP) are its children. ``sa-jobqueue worker`` adds one when the app's queue
  has ``tracing=True``; a :class:`~sa_jobqueue.Worker` of your own takes it in ``observers``.

The run's span is *linked* to the enqueuing span by default and starts a trace of its own,
as OpenTelemetry's messaging conventions advise: a job may run hours after the request that
enqueued it, and more than once, and a trace stretched over all of that is hard to read.
``TracingObserver(parent=True)`` makes it a child of the enqueuing span instead: one trace
from request to job. Baggage stored with the job is current during the run either way.

The spans go wherever your OpenTelemetry SDK sends them. This module uses the API only:
without an SDK configured (``opentelemetry-instrument``, the ``OTEL_*`` environment variables
with the SDK installed, or a ``TracerProvider`` set in your app module) every call here is a
no-op, and no trace context is stored.

What is not promised: a span for an attempt that never ran its handler (unknown task, worker
killed before the handler returned), or an exported span at all for an attempt whose worker
is killed: exporting is the SDK's business, after the span ends.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "sa_jobqueue's tracing needs opentelemetry-api: pip install 'sa_jobqueue[tracing]'"
    ) from exc

from ._observer import JobRun, Observer

log = logging.getLogger("sa_jobqueue.tracing")

#: The instrumentation scope the spans are created under.
TRACER_NAME: Final = "sa_jobqueue"
#: Outcomes that mark the run's span as failed (status ERROR).
FAILED_OUTCOMES: Final = frozenset({"retried", "dead", "lost"})
#: Spans of attempts whose outcome has not been reported yet, at most. A report that never
#: comes (a bug, an outcome lost with its worker thread) cannot grow the table for ever: past
#: this many, the oldest span is ended without an outcome.
MAX_OPEN_SPANS: Final = 10_000


def current_trace_context() -> str | None:
    """The current context as the global propagator writes it, as JSON text; None if empty."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return json.dumps(carrier, separators=(",", ":")) if carrier else None


@dataclass(slots=True)
class _Open:
    """The span of one attempt, from its handler's start until its outcome is reported."""

    span: trace.Span
    recorded: set[int] = field(default_factory=set)  # id() of the exceptions already recorded
    ended_at: int | None = None  # time.time_ns() when the handler returned or raised
    outcome: str | None = None
    closed: bool = False


class TracingObserver(Observer):
    """Runs each attempt's handler in a ``CONSUMER`` span linked to the enqueuing trace.

    The span ends when the handler returns or raises, but is exported only once the attempt's
    outcome is known (``sa_jobqueue.outcome``: succeeded, retried, dead, cancelled, lost,
    handed_back): a batched completion records it a few milliseconds later. A handler's
    exception is recorded on the span; ``retried``, ``dead`` and ``lost`` set its status to
    ERROR. ``parent=True``: a child of the enqueuing span rather than linked to it.
    ``tracer_provider``: default, the global one.
    """

    def __init__(
        self, *, parent: bool = False, tracer_provider: trace.TracerProvider | None = None
    ) -> None:
        self.parent = parent
        self._tracer = trace.get_tracer(TRACER_NAME, tracer_provider=tracer_provider)
        self._lock = threading.Lock()
        self._open: OrderedDict[tuple[int, int], _Open] = OrderedDict()

    @contextlib.contextmanager
    def running(self, job: JobRun) -> Iterator[None]:
        base = otel_context.Context()
        links: list[trace.Link] = []
        if isinstance(job.trace_context, Mapping) and job.trace_context:
            base = propagate.extract(_carrier(job.trace_context), context=base)
            origin = trace.get_current_span(base).get_span_context()
            if origin.is_valid and not self.parent:
                links.append(trace.Link(origin))
                # A trace of its own, but the baggage that came with the job stays current.
                base = trace.set_span_in_context(trace.INVALID_SPAN, base)
        span = self._tracer.start_span(
            f"sa_jobqueue run {job.task}",
            context=base,
            kind=trace.SpanKind.CONSUMER,
            links=links,
            attributes={
                "messaging.system": "sa_jobqueue",
                "messaging.operation.type": "process",
                "messaging.operation.name": "run",
                "messaging.destination.name": job.queue,
                "messaging.message.id": str(job.id),
                "sa_jobqueue.job.id": job.id,
                "sa_jobqueue.task": job.task,
                "sa_jobqueue.attempt": job.attempt,
                "sa_jobqueue.max_attempts": job.max_attempts,
            },
        )
        key = (job.id, job.attempt)
        entry = _Open(span)
        with self._lock:
            self._open[key] = entry
            evicted = []
            while len(self._open) > MAX_OPEN_SPANS:
                evicted.append(self._open.popitem(last=False)[1])
        for old in evicted:
            self._evict(old)
        token = otel_context.attach(trace.set_span_in_context(span, base))
        try:
            yield
        except BaseException as exc:
            with self._lock:
                if not entry.closed:
                    _record(entry, exc)
            raise
        finally:
            otel_context.detach(token)
            with self._lock:
                entry.ended_at = time.time_ns()
                end = entry.outcome is not None and not entry.closed
                entry.closed = entry.closed or end
            if end:  # its outcome came first: a timeout, recorded while the handler ran on
                span.end(end_time=entry.ended_at)

    def finished(
        self, job: JobRun, outcome: str, run_time: float | None, error: BaseException | None
    ) -> None:
        with self._lock:
            entry = self._open.pop((job.id, job.attempt), None)
            if entry is None or entry.closed:
                return  # it never ran a handler (unknown task), or its span was evicted
            entry.outcome = outcome
            entry.span.set_attribute("sa_jobqueue.outcome", outcome)
            if error is not None:
                _record(entry, error)
            if outcome in FAILED_OUTCOMES:
                entry.span.set_status(trace.StatusCode.ERROR, _describe(outcome, error))
            end_at = entry.ended_at
            entry.closed = end_at is not None
        if end_at is not None:
            entry.span.end(end_time=end_at)

    def lease_lost(self, job: JobRun) -> None:
        with self._lock:
            entry = self._open.get((job.id, job.attempt))
            if entry is not None and not entry.closed:
                entry.span.add_event("sa_jobqueue.lease_lost")

    def _evict(self, entry: _Open) -> None:
        with self._lock:
            if entry.closed:
                return
            entry.closed = True
        log.warning("%d job spans wait for an outcome; ending the oldest", MAX_OPEN_SPANS)
        entry.span.end(end_time=entry.ended_at)


def _carrier(stored: Mapping[str, object]) -> dict[str, str]:
    """The stored context as a propagator's carrier: string values only (the row is JSON)."""
    return {k: v for k, v in stored.items() if isinstance(v, str)}


def _record(entry: _Open, exc: BaseException) -> None:
    if id(exc) not in entry.recorded:
        entry.recorded.add(id(exc))
        entry.span.record_exception(exc)
        entry.span.set_status(trace.StatusCode.ERROR, _describe(None, exc))


def _describe(outcome: str | None, error: BaseException | None) -> str:
    if error is None:
        return "the attempt lost its lease" if outcome == "lost" else str(outcome)
    try:
        message = str(error)
    except Exception:  # a broken __str__ must not cost the span
        message = "<unprintable>"
    return f"{type(error).__name__}: {message[:200]}"
