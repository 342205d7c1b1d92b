"""Progress reports in memory: the checks at the call, the store the heartbeat reads, and when
a report brings a renewal forward (the renewal itself is faked here)."""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from datetime import timedelta
from fractions import Fraction
from typing import Any

import pytest

from sa_jobqueue._progress import MAX_PROGRESS_MESSAGE, ProgressReport, check_progress
from sa_jobqueue.batching import BatchContext
from sa_jobqueue.errors import InvalidProgressError
from sa_jobqueue.observability import Observers
from sa_jobqueue.tasks import Backoff, JobContext, Task
from sa_jobqueue.worker._claimed import Claimed
from sa_jobqueue.worker._heartbeat import Heartbeat
from sa_jobqueue.worker._lanes import Lane
from sa_jobqueue.worker._leases import Held, LeaseTable
from sa_jobqueue.worker._progress import PROGRESS_INTERVAL, Carried, unwritten


def context(job_id: int = 1) -> JobContext:
    return JobContext(
        job_id=job_id,
        task="t",
        queue="q",
        attempt=1,
        max_attempts=5,
        session=lambda: None,  # type: ignore[arg-type,return-value]
    )


@pytest.mark.parametrize(
    ("fraction", "message"),
    [(0, None), (1, "done"), (0.25, ""), (Fraction(1, 3), "a third"), (0.5, "é" * 200)],
)
def test_a_valid_report_is_kept_as_a_float_and_its_message(fraction: Any, message: Any) -> None:
    assert check_progress(fraction, message) == (float(fraction), message)
    assert type(check_progress(fraction, message).fraction) is float


@pytest.mark.parametrize(
    ("fraction", "message", "says"),
    [
        (-0.01, None, "from 0 to 1"),
        (1.0001, None, "from 0 to 1"),
        (math.nan, None, "from 0 to 1"),
        (math.inf, None, "from 0 to 1"),
        (True, None, "a float"),
        ("0.5", None, "a float"),
        (None, None, "a float"),
        (0.5, 42, "a str"),
        (0.5, "x" * (MAX_PROGRESS_MESSAGE + 1), "at most 200 characters"),
        (0.5, "a\x00b", "NUL"),
        (0.5, "\ud800", "UTF-8"),
    ],
)
def test_a_report_that_is_not_valid_is_refused_at_the_call(
    fraction: Any, message: Any, says: str
) -> None:
    ctx = context()
    with pytest.raises(InvalidProgressError, match=says) as refused:
        ctx.report_progress(fraction, message)
    assert isinstance(refused.value, ValueError)
    assert ctx.progress is None  # nothing kept


def test_the_latest_report_replaces_the_last_whole() -> None:
    ctx = context()
    assert ctx.progress is None
    ctx.report_progress(0.1, "reading")
    ctx.report_progress(0.2)
    assert ctx.progress == (0.2, None)  # no message: the last one's is cleared
    assert unwritten(ctx) == ProgressReport(0.2, None)


def test_a_report_is_unwritten_until_the_heartbeat_writes_that_very_one() -> None:
    ctx = context()
    assert unwritten(ctx) is None
    assert unwritten(None) is None
    ctx.report_progress(0.5, "half")
    sent = Carried({1: held(ctx)})
    assert sent.param == {"1": {"fraction": 0.5, "message": "half"}}
    ctx.report_progress(0.6, "more")  # made while the renewal is under way
    sent.written({1})
    assert unwritten(ctx) == (0.6, "more")  # still to write: a newer one than was sent
    Carried({1: held(ctx)}).written({1})
    assert unwritten(ctx) is None
    # The same values reported again are a new report, written again (a fresh progress_at).
    ctx.report_progress(0.6, "more")
    assert unwritten(ctx) == (0.6, "more")


def test_a_batch_report_is_written_once_every_job_sharing_it_was_renewed() -> None:
    shared = context(1)
    batch = BatchContext(task="t", queue="q", job_ids=[1, 2], members=[shared], session=None)  # type: ignore[arg-type]
    batch.report_progress(0.3, "30 of 100")
    assert batch.progress == (0.3, "30 of 100")
    carried = Carried({1: held(shared), 2: held(shared), 3: held(context(3))})
    assert set(carried.param) == {"1", "2"}
    assert len(carried) == 2
    carried.written({1})  # job 2's row was locked: renewed at the retry, with the report
    assert unwritten(shared) == (0.3, "30 of 100")
    carried.written({1, 2})
    assert unwritten(shared) is None
    with pytest.raises(InvalidProgressError):
        batch.report_progress(2, None)


def test_a_failed_renewal_gives_its_reports_up_and_the_next_report_is_written() -> None:
    ctx = context()
    ctx.report_progress(0.5, "half")
    carried = Carried({1: held(ctx)})
    carried.given_up()
    assert unwritten(ctx) is None
    assert Carried({1: held(ctx)}).param == {}
    ctx.report_progress(0.7)
    assert Carried({1: held(ctx)}).param == {"1": {"fraction": 0.7, "message": None}}


def test_reports_from_many_threads_leave_one_whole_report() -> None:
    ctx = context()
    reports = [(i / 1000, f"step {i}") for i in range(1001)]

    def report(part: list[tuple[float, str]]) -> None:
        for fraction, message in part:
            ctx.report_progress(fraction, message)

    threads = [threading.Thread(target=report, args=(reports[i::4],)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert ctx.progress in reports  # one of them, never a fraction of one with another's message


def held(ctx: JobContext | None, lease: float = 30.0) -> Held:
    return Held(1, timedelta(seconds=lease), renew_at=1e9, ctx=ctx)


class Renewals:
    """The heartbeat's renewal, faked: which attempts each renewal took."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[int], bool]] = []

    def __call__(self, held: Mapping[int, Held], *, full: bool = True) -> set[int]:
        self.calls.append((sorted(held), full))
        Carried(held).written(set(held))
        return set()


def heartbeat_of(jobs: int) -> tuple[Heartbeat, LeaseTable, list[JobContext], Renewals]:
    leases = LeaseTable()
    lane = Lane(["q"], jobs, 0)
    heartbeat = Heartbeat(None, leases, None, Observers([]), threading.Event())  # type: ignore[arg-type]
    renewals = Renewals()
    heartbeat._renew = renewals  # type: ignore[method-assign]
    contexts = []
    for job_id in range(1, jobs + 1):
        job = Claimed(job_id, "q", "t", "null", "running", 1, 5, timedelta(seconds=30), None, None)
        leases.hold(lane, job)
        ctx = context(job_id)
        leases.start(job, ctx, Task(name="t", handler=lambda c, p: None), None, Backoff())
        contexts.append(ctx)
    return heartbeat, leases, contexts, renewals


def test_a_report_brings_a_renewal_of_the_reporting_jobs_alone_forward_at_most_so_often() -> None:
    heartbeat, leases, contexts, renewals = heartbeat_of(3)
    start = min(h.renew_at for h in leases.snapshot().values()) - 10  # 10 s before one is due
    heartbeat.turn(start)
    assert renewals.calls == []  # nothing reported, nothing due
    contexts[1].report_progress(0.5)
    heartbeat.turn(start + 0.1)
    assert renewals.calls == [([2], False)]  # the first report: written at once
    for i in range(100):  # reports in a tight loop, turns every tick
        contexts[1].report_progress(i / 100)
        heartbeat.turn(start + 0.2 + i * 0.01)
    assert len(renewals.calls) == 1  # not before PROGRESS_INTERVAL has passed
    heartbeat.turn(start + 0.1 + PROGRESS_INTERVAL)
    assert renewals.calls[1:] == [([2], False)]
    assert unwritten(contexts[1]) is None
    heartbeat.turn(start + 0.1 + 2 * PROGRESS_INTERVAL)  # nothing new: no renewal
    assert len(renewals.calls) == 2
    # The leases' own renewal takes every job, as before.
    heartbeat.turn(start + 10)
    assert renewals.calls[2:] == [([1, 2, 3], True)]
