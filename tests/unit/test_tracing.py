"""The tracing observer, without a database."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider

from sa_jobqueue._sql import enqueue as enqueue_sql
from sa_jobqueue.observability import JobRun
from sa_jobqueue.observability.tracing import TracingObserver


def test_only_a_traced_insert_names_the_column() -> None:
    for traced in (False, True):
        texts = [
            str(enqueue_sql.insert_job("now", True, traced=traced)),
            str(enqueue_sql.insert_job("at", False, unique=True, traced=traced)),
            str(enqueue_sql.insert_jobs("after", traced=traced)),
            str(enqueue_sql.insert_jobs("now", unique=True, traced=traced)),
        ]
        assert all(("trace_context" in text) is traced for text in texts)


def test_observer_ignores_an_attempt_that_never_ran(provider: TracerProvider) -> None:
    observer = TracingObserver(tracer_provider=provider)
    observer.finished(JobRun(1, "gone", "default", 1, 5), "dead", None, LookupError("gone"))
    observer.lease_lost(JobRun(1, "gone", "default", 1, 5))
    assert not observer._open
