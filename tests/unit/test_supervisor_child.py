"""The recycler a supervised worker process runs, and how the supervisor names a child's end."""

from __future__ import annotations

import signal

from sa_jobqueue.observability import JobRun
from sa_jobqueue.worker._child import Recycler, resident_bytes
from sa_jobqueue.worker._supervisor import _cause

JOB = JobRun(id=1, task="t", queue="default", attempt=1, max_attempts=3)


def recycler(max_jobs: int | None, max_memory: int | None) -> tuple[Recycler, list[None]]:
    stops: list[None] = []
    recycler = Recycler(max_jobs, max_memory)
    recycler.attach(lambda: stops.append(None))
    return recycler, stops


def test_it_stops_the_worker_once_after_its_jobs_not_counting_hand_backs() -> None:
    r, stops = recycler(max_jobs=3, max_memory=None)
    for outcome in ("succeeded", "handed_back", "retried", "handed_back"):
        r.finished(JOB, outcome, 0.01, None)
    assert stops == []
    assert r.reason is None
    r.finished(JOB, "dead", 0.01, None)
    assert len(stops) == 1
    assert r.reason is not None
    assert "3 jobs" in r.reason
    r.finished(JOB, "succeeded", 0.01, None)  # a job that was running meanwhile
    assert len(stops) == 1


def test_it_stops_the_worker_above_its_memory() -> None:
    used = resident_bytes()
    assert used > 1 << 20  # a Python process uses more than a MiB
    r, stops = recycler(max_jobs=None, max_memory=used * 4)
    r.finished(JOB, "succeeded", 0.01, None)
    assert stops == []
    r, stops = recycler(max_jobs=None, max_memory=used // 2)
    r.finished(JOB, "succeeded", 0.01, None)
    assert len(stops) == 1
    assert r.reason is not None
    assert "MiB" in r.reason


def test_a_childs_end_is_named_by_its_status_or_signal() -> None:
    assert _cause(1) == "exited with status 1"
    assert _cause(-signal.SIGKILL) == "was killed by SIGKILL"
