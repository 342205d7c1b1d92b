"""The metrics observer's counters, without a database."""

from __future__ import annotations

from sa_jobqueue.observability import JobRun
from sa_jobqueue.observability.metrics import (
    PrometheusObserver,
)


def test_observer_counts_lease_losses_and_new_outcomes() -> None:
    observer = PrometheusObserver()
    run = JobRun(9, "ok", "emails", 1, 5)
    observer.lease_lost(run)
    observer.finished(run, "vanished", None, None)  # an outcome added after this module
    get = observer.registry.get_sample_value
    assert get("sa_jobqueue_lease_losses_total", {"queue": "emails", "task": "ok"}) == 1
    labels = {"queue": "emails", "task": "ok", "outcome": "vanished"}
    assert get("sa_jobqueue_jobs_finished_total", labels) == 1
    assert get("sa_jobqueue_job_run_seconds_count", {"queue": "emails", "task": "ok"}) == 0


def test_observers_have_registries_of_their_own() -> None:
    # Two in one process (tests, or two workers in one app) do not collide.
    first, second = PrometheusObserver(), PrometheusObserver()
    first.started(JobRun(1, "ok", "default", 1, 5))
    labels = {"queue": "default", "task": "ok"}
    assert first.registry.get_sample_value("sa_jobqueue_jobs_started_total", labels) == 1
    assert second.registry.get_sample_value("sa_jobqueue_jobs_started_total", labels) is None
