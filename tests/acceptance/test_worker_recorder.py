"""The recorder: each verdict's fenced statement, and the outcome observers are told."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from sa_jobqueue import Discard, JobQueue, Retry
from sa_jobqueue._sql import claiming
from sa_jobqueue.errors import PayloadError
from sa_jobqueue.models import Job
from sa_jobqueue.observability import Observers
from sa_jobqueue.tasks import Task
from sa_jobqueue.worker._claimed import Claimed
from sa_jobqueue.worker._recorder import Recorder
from sa_jobqueue.worker._reports import Reports
from sa_jobqueue.worker._sessions import HandlerSession
from sa_jobqueue.worker._settlement import Abandon, Bury, Complete, Fail, Snooze
from tests.helpers.observers import Outcomes


@pytest.fixture
def recorded(db: sa.Engine) -> Iterator[tuple[Recorder, Outcomes]]:
    outcomes = Outcomes()
    recorder = Recorder(
        db.execution_options(isolation_level="AUTOCOMMIT"), Reports(Observers([outcomes]))
    )
    yield recorder, outcomes
    recorder.close()


QUEUE = JobQueue()


@QUEUE.task(max_attempts=2)
def work(ctx: object, payload: object) -> None:
    pass


TASK: Task = QUEUE.get_task("work")


def claim(db: sa.Engine, recorder: Recorder, n: int = 1) -> list[Claimed]:
    """Enqueue and claim ``n`` jobs; each waits for its outcome report as after its handler."""
    with Session(db) as session, session.begin():
        for _ in range(n):
            QUEUE.enqueue(session, "work")
    with db.begin() as conn:
        rows = conn.execute(
            claiming.claim(), {"from_queue": "default", "limit": n, "worker": "w"}
        ).all()
    jobs = [Claimed.of(row) for row in rows]
    for job in jobs:
        recorder.reports.ran(job, job.run(), 0.01)
    return jobs


def status(db: sa.Engine, job_id: int) -> str:
    with Session(db) as session:
        row = session.get(Job, job_id)
        assert row is not None
        return row.status


def take_over(db: sa.Engine, job: Claimed) -> None:
    """Another worker reclaims the job: this attempt is stale."""
    with db.begin() as conn:
        conn.execute(sa.update(Job).where(Job.id == job.id).values(attempts=job.attempts + 1))


def test_a_failure_retries_then_is_dead_on_the_last_attempt(
    db: sa.Engine, recorded: tuple[Recorder, Outcomes]
) -> None:
    recorder, outcomes = recorded
    (job,) = claim(db, recorder)
    recorder.record(job, Fail(ValueError("boom")), TASK)
    assert status(db, job.id) == "queued"
    with db.begin() as conn:  # due again now, and claimed for its last attempt
        conn.execute(sa.update(Job).where(Job.id == job.id).values(visible_at=sa.func.now()))
        (row,) = conn.execute(
            claiming.claim(), {"from_queue": "default", "limit": 1, "worker": "w"}
        ).all()
    last = Claimed.of(row)
    recorder.reports.ran(last, last.run(), 0.01)
    recorder.record(last, Fail(ValueError("boom")), TASK)
    assert status(db, job.id) == "dead"
    assert outcomes.seen == [(job.id, "retried"), (job.id, "dead")]


def test_retry_snoozes_and_discard_buries(
    db: sa.Engine, recorded: tuple[Recorder, Outcomes]
) -> None:
    recorder, outcomes = recorded
    snoozed, buried = claim(db, recorder, 2)
    recorder.record(snoozed, Snooze(Retry(after=timedelta(minutes=5))), TASK)
    recorder.record(buried, Bury(Discard("unwanted")), TASK)
    assert (status(db, snoozed.id), status(db, buried.id)) == ("queued", "dead")
    assert outcomes.seen == [(snoozed.id, "retried"), (buried.id, "dead")]


def test_a_stale_attempt_writes_nothing_and_is_reported_lost(
    db: sa.Engine, recorded: tuple[Recorder, Outcomes]
) -> None:
    recorder, outcomes = recorded
    failed, abandoned = claim(db, recorder, 2)
    take_over(db, failed)
    take_over(db, abandoned)
    recorder.record(failed, Fail(ValueError("late")), TASK)
    recorder.record(abandoned, Abandon(), TASK)
    assert (status(db, failed.id), status(db, abandoned.id)) == ("running", "running")
    assert outcomes.seen == [(failed.id, "lost"), (abandoned.id, "lost")]


def test_an_abandoned_attempt_of_a_cancelled_job_finishes_it_cancelled(
    db: sa.Engine, recorded: tuple[Recorder, Outcomes]
) -> None:
    recorder, outcomes = recorded
    (job,) = claim(db, recorder)
    with db.begin() as conn:
        conn.execute(sa.update(Job).where(Job.id == job.id).values(cancel_requested=True))
    recorder.record(job, Abandon(), TASK)
    assert status(db, job.id) == "cancelled"
    assert outcomes.seen == [(job.id, "cancelled")]


def test_completions_batched_or_in_the_handlers_transaction(
    db: sa.Engine, recorded: tuple[Recorder, Outcomes]
) -> None:
    recorder, outcomes = recorded
    batched, own, stale = claim(db, recorder, 3)
    recorder.record(batched, Complete(batched=True), TASK)
    with HandlerSession(bind=db) as session:
        session.execute(sa.text("SELECT 1"))
        assert recorder.complete_in(session, own)
    take_over(db, stale)
    with HandlerSession(bind=db) as session:
        session.execute(sa.text("SELECT 1"))
        assert not recorder.complete_in(session, stale)
        session.rollback()
    recorder.close()  # flushes the batch
    assert (status(db, batched.id), status(db, own.id), status(db, stale.id)) == (
        "succeeded",
        "succeeded",
        "running",
    )
    assert sorted(outcomes.seen) == sorted([(batched.id, "succeeded"), (own.id, "succeeded")])


def test_hand_back_returns_the_attempt_uncounted(
    db: sa.Engine, recorded: tuple[Recorder, Outcomes]
) -> None:
    recorder, outcomes = recorded
    (job,) = claim(db, recorder)
    recorder.hand_back([job], "shutting down", report=True)
    with Session(db) as session:
        row = session.get(Job, job.id)
        assert row is not None
        assert (row.status, row.attempts) == ("queued", 0)
    assert outcomes.seen == [(job.id, "handed_back")]


def test_a_job_handed_back_takes_its_place_again_ahead_of_later_jobs(
    db: sa.Engine, recorded: tuple[Recorder, Outcomes]
) -> None:
    """A rolling restart hands back each worker's buffered jobs: they are claimed again
    before the jobs enqueued after them, as if they had never been claimed."""
    recorder, _ = recorded
    (job,) = claim(db, recorder)
    with Session(db) as session, session.begin():
        later = [QUEUE.enqueue(session, "work") for _ in range(2)]
    recorder.hand_back([job], "shutting down")
    with db.begin() as conn:
        params = {"from_queue": "default", "limit": 3, "worker": "w"}
        again = [row.id for row in conn.execute(claiming.claim(), params)]
    assert again == [job.id, *later]


def test_an_unrunnable_job_is_dead_and_its_log_line_shows_control_characters(
    db: sa.Engine, recorded: tuple[Recorder, Outcomes], caplog: pytest.LogCaptureFixture
) -> None:
    recorder, outcomes = recorded
    (job,) = claim(db, recorder)
    caplog.set_level(logging.ERROR, logger="sa_jobqueue.worker")
    recorder.unrunnable(job, PayloadError("bad\x1b[2J payload\u202e\nsecond line"))
    assert status(db, job.id) == "dead"
    assert outcomes.seen == [(job.id, "dead")]
    (record,) = [r for r in caplog.records if r.name == "sa_jobqueue.worker"]
    # Written out, on one line, whatever formatter the application's logging uses.
    assert record.getMessage() == f"job {job.id}: bad\\x1b[2J payload\\u202e; moved to dead"
