"""Tracing: a job carries the trace that enqueued it, and each run is a span pointing back to it.

The SDK's in-memory exporter collects the spans; the tracer provider is passed explicitly (the
global one can be set only once per process). The global propagator is OpenTelemetry's
default: W3C trace context and baggage.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from opentelemetry import baggage, trace
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from sa_jobqueue import Backoff, JobContext, JobQueue, Worker
from sa_jobqueue.models import jobs_table
from sa_jobqueue.observability.tracing import TracingObserver
from tests.helpers.waiting import running, wait_for

j = jobs_table.c


class App:
    """A traced queue whose handlers note the span and baggage current while they run."""

    def __init__(self) -> None:
        self.queue = JobQueue(tracing=True)
        self.seen: dict[int, tuple[int, object]] = {}  # job id -> (span id, baggage "user")
        fast = Backoff(base=timedelta(milliseconds=10), jitter=0)

        @self.queue.task
        def ok(ctx: JobContext, payload: Any) -> None:
            self.note(ctx)

        @self.queue.task(max_attempts=2, backoff=fast)
        def fails(ctx: JobContext, payload: Any) -> None:
            self.note(ctx)
            raise ValueError("boom")

        @self.queue.task(max_attempts=1, timeout=timedelta(seconds=0.2))
        def overruns(ctx: JobContext, payload: Any) -> None:
            while not ctx.stop_requested:
                threading.Event().wait(0.01)

        @self.queue.task
        async def awaits(ctx: JobContext, payload: Any) -> None:
            await asyncio.sleep(0)
            self.note(ctx)

    def note(self, ctx: JobContext) -> None:
        span_id = trace.get_current_span().get_span_context().span_id
        self.seen[ctx.job_id] = (span_id, baggage.get_baggage("user"))


def attr(item: Any, name: str) -> Any:
    """An attribute of a span or an event (their ``attributes`` may be None to the types)."""
    return (item.attributes or {})[name]


def job_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith("sa_jobqueue run")]


def run_until(app: App, engine: sa.Engine, observer: TracingObserver, done: Any) -> None:
    worker = Worker(
        app.queue,
        engine,
        concurrency=2,
        poll_interval=timedelta(seconds=0.05),
        retention=None,
        observers=[observer],
    )
    with running(worker):
        wait_for(done)


def stored_context(engine: sa.Engine, job_id: int) -> Any:
    with engine.connect() as conn:
        return conn.execute(sa.select(j.trace_context).where(j.id == job_id)).scalar_one()


def test_a_job_run_is_a_span_linked_to_the_enqueuing_span(
    engine: sa.Engine, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    app = App()
    tracer = provider.get_tracer("tests")
    token = otel_context.attach(baggage.set_baggage("user", "ada"))
    try:
        with tracer.start_as_current_span("request") as request, Session(engine) as session:
            good = app.queue.enqueue(session, "ok")
            bad = app.queue.enqueue(session, "fails")
            many = app.queue.enqueue_many(session, "ok", [1, 2])
            session.commit()
    finally:
        otel_context.detach(token)
    origin = request.get_span_context()
    traceparent = stored_context(engine, good)["traceparent"]
    assert traceparent.startswith(f"00-{origin.trace_id:032x}-{origin.span_id:016x}-")
    assert stored_context(engine, many[1])["traceparent"] == traceparent
    assert stored_context(engine, good)["baggage"] == "user=ada"

    run_until(
        app,
        engine,
        TracingObserver(tracer_provider=provider),
        lambda: len(job_spans(exporter)) == 5,
    )

    spans = {
        (attr(s, "sa_jobqueue.job.id"), attr(s, "sa_jobqueue.attempt")): s
        for s in job_spans(exporter)
    }
    assert set(spans) == {(good, 1), (bad, 1), (bad, 2), (many[0], 1), (many[1], 1)}
    for span in spans.values():
        assert span.kind is trace.SpanKind.CONSUMER
        assert span.parent is None  # a trace of its own ...
        assert span.context.trace_id != origin.trace_id
        [link] = span.links  # ... linked to the request that enqueued the job
        assert (link.context.trace_id, link.context.span_id) == (origin.trace_id, origin.span_id)
        assert attr(span, "messaging.system") == "sa_jobqueue"
        assert attr(span, "messaging.destination.name") == "default"
    ran = spans[good, 1]
    assert ran.name == "sa_jobqueue run ok"
    assert attr(ran, "sa_jobqueue.outcome") == "succeeded"
    assert ran.status.status_code is trace.StatusCode.UNSET
    # The handler ran inside the span, with the baggage that came with the job.
    assert app.seen[good] == (ran.context.span_id, "ada")
    retried, dead = spans[bad, 1], spans[bad, 2]
    assert attr(retried, "sa_jobqueue.outcome") == "retried"
    assert attr(dead, "sa_jobqueue.outcome") == "dead"
    for failed in (retried, dead):
        assert failed.status.status_code is trace.StatusCode.ERROR
        [event] = failed.events
        assert event.name == "exception"
        assert attr(event, "exception.type") == "ValueError"


def test_parent_mode_makes_the_run_a_child_of_the_enqueuing_span(
    engine: sa.Engine, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    app = App()
    tracer = provider.get_tracer("tests")
    with tracer.start_as_current_span("request") as request, Session(engine) as session:
        job = app.queue.enqueue(session, "awaits")
        session.commit()
    observer = TracingObserver(parent=True, tracer_provider=provider)
    run_until(app, engine, observer, lambda: job_spans(exporter))
    [span] = job_spans(exporter)
    origin = request.get_span_context()
    assert span.parent is not None
    assert (span.parent.trace_id, span.parent.span_id) == (origin.trace_id, origin.span_id)
    assert span.context.trace_id == origin.trace_id
    assert not span.links
    assert app.seen[job][0] == span.context.span_id  # an async handler runs in it too


def test_an_attempt_that_times_out_gets_its_outcome_though_it_comes_first(
    engine: sa.Engine, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    # The timeout is recorded (and reported) while the handler still runs; the span ends when
    # the handler returns, with the outcome already on it.
    app = App()
    with Session(engine) as session:
        app.queue.enqueue(session, "overruns")
        session.commit()
    observer = TracingObserver(tracer_provider=provider)
    run_until(app, engine, observer, lambda: job_spans(exporter))
    [span] = job_spans(exporter)
    assert attr(span, "sa_jobqueue.outcome") == "dead"
    assert span.status.status_code is trace.StatusCode.ERROR
    assert [attr(e, "exception.type") for e in span.events] == ["TimeoutError"]
    assert not observer._open  # nothing left waiting


def test_without_a_current_span_nothing_is_stored_and_the_insert_is_unchanged(
    engine: sa.Engine, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    app = App()
    sent: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(statement)

    sa.event.listen(engine, "before_cursor_execute", record)
    with Session(engine) as session:
        job = app.queue.enqueue(session, "ok")
        [other] = app.queue.enqueue_many(session, "ok", [1])
        session.commit()
    sa.event.remove(engine, "before_cursor_execute", record)
    assert stored_context(engine, job) is None
    assert stored_context(engine, other) is None
    inserts = [statement for statement in sent if statement.startswith("INSERT")]
    assert len(inserts) == 2
    assert not any("trace_context" in statement for statement in inserts)
    run_until(
        app,
        engine,
        TracingObserver(tracer_provider=provider),
        lambda: len(job_spans(exporter)) == 2,
    )
    assert all(not span.links and span.parent is None for span in job_spans(exporter))


def test_async_enqueue_stores_the_callers_context(
    engine: sa.Engine, database_url: URL, provider: TracerProvider
) -> None:
    app = App()
    tracer = provider.get_tracer("tests")

    async def scenario() -> tuple[int, int, int]:
        async_engine = create_async_engine(database_url)
        try:
            with tracer.start_as_current_span("async request") as request:
                async with AsyncSession(async_engine) as session:
                    one = await app.queue.aenqueue(session, "ok")
                    [two] = await app.queue.aenqueue_many(session, "ok", [1])
                    await session.commit()
            return one, two, request.get_span_context().trace_id
        finally:
            await async_engine.dispose()

    one, two, trace_id = asyncio.run(scenario())
    for job in (one, two):
        assert stored_context(engine, job)["traceparent"].split("-")[1] == f"{trace_id:032x}"
