"""The heartbeat's timeout: recorded first, then the handler is told, and reported once."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

from sa_jobqueue.observability import JobRun, Observer, Observers
from sa_jobqueue.tasks import Backoff, JobContext, Task
from sa_jobqueue.worker._claimed import Claimed
from sa_jobqueue.worker._heartbeat import Heartbeat
from sa_jobqueue.worker._lanes import Lane
from sa_jobqueue.worker._leases import LeaseTable
from sa_jobqueue.worker._recorder import Recorder
from sa_jobqueue.worker._reports import Reports
from sa_jobqueue.worker._settlement import Outcome


class Row:
    def __init__(self, status: str) -> None:
        self.status = status


class FakeRecorder:
    def __init__(self, reports: Reports, status: str | None) -> None:
        self.reports = reports
        self.status = status
        self.failed: list[tuple[int, int, Backoff, BaseException]] = []

    def fail(self, job_id: int, attempt: int, backoff: Backoff, exc: BaseException) -> Any:
        self.failed.append((job_id, attempt, backoff, exc))
        return None if self.status is None else Row(self.status)

    # The real door's: what the observers hear of a timeout is the recorder's to say.
    timed_out = Recorder.timed_out


class Seen(Observer):
    def __init__(self) -> None:
        self.finished_with: list[tuple[str, float | None]] = []

    def finished(
        self, job: JobRun, outcome: str, run_time: float | None, error: BaseException | None
    ) -> None:
        self.finished_with.append((outcome, run_time))


def timed_out_job(status: str | None) -> tuple[Heartbeat, LeaseTable, FakeRecorder, Seen, Any]:
    seen = Seen()
    observe = Observers([seen])
    leases = LeaseTable()
    recorder = FakeRecorder(Reports(observe), status)
    heartbeat = Heartbeat(None, leases, recorder, observe, threading.Event())  # type: ignore[arg-type]
    job = Claimed(9, "q", "t", "null", "running", 2, 3, timedelta(seconds=30), None, None)
    leases.hold(Lane(["q"], 1, 0), job)
    ctx = JobContext(
        job_id=9,
        task="t",
        queue="q",
        attempt=2,
        max_attempts=3,
        session=lambda: None,  # type: ignore[arg-type,return-value]
    )
    task = Task(name="t", handler=lambda c, p: None, timeout=timedelta(seconds=2))
    leases.start(job, ctx, task, job.run(), Backoff())
    return heartbeat, leases, recorder, seen, ctx


def test_a_timeout_is_recorded_then_the_handler_told_and_the_lease_dropped() -> None:
    heartbeat, leases, recorder, seen, ctx = timed_out_job("queued")
    held = leases.snapshot()
    heartbeat._time_out(9, held[9])
    assert [(j, a, type(e)) for j, a, _, e in recorder.failed] == [(9, 2, TimeoutError)]
    assert ctx.stop_requested
    assert leases.snapshot() == {}
    assert seen.finished_with == [("retried", 2.0)]  # reported with the timeout as run time


def test_a_timeout_on_the_last_attempt_is_reported_dead_and_the_late_return_not_again() -> None:
    heartbeat, leases, recorder, seen, _ctx = timed_out_job("dead")
    heartbeat._time_out(9, leases.snapshot()[9])
    assert seen.finished_with == [("dead", 2.0)]
    job = Claimed(9, "q", "t", "null", "running", 2, 3, timedelta(seconds=30), None, None)
    recorder.reports.ran(job, job.run(), 5.0)  # the handler returns after all
    recorder.reports.report(9, 2, Outcome.LOST)
    assert seen.finished_with == [("dead", 2.0)]


def test_a_stale_timeout_tells_the_handler_but_reports_nothing() -> None:
    heartbeat, leases, _recorder, seen, ctx = timed_out_job(None)
    heartbeat._time_out(9, leases.snapshot()[9])
    assert ctx.stop_requested
    assert seen.finished_with == []
