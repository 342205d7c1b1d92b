"""Attempt history: each attempt that did not succeed leaves an entry, written by its fenced
statement; a stale attempt leaves none; the array keeps its bound; a requeue keeps it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from sa_jobqueue import JobQueue
from sa_jobqueue._error_text import MAX_ERROR_MESSAGE, MAX_ERROR_TRACEBACK
from sa_jobqueue._sql import claiming
from sa_jobqueue.models import ATTEMPT_HISTORY_LIMIT, Job
from sa_jobqueue.observability import Observers
from sa_jobqueue.ops.admin import get_job, requeue_job
from sa_jobqueue.tasks import Task
from sa_jobqueue.worker._claimed import Claimed
from sa_jobqueue.worker._recorder import Recorder
from sa_jobqueue.worker._reports import Reports
from sa_jobqueue.worker._settlement import Complete, Fail

QUEUE = JobQueue()


@QUEUE.task(max_attempts=3)
def work(ctx: object, payload: object) -> None:
    pass


TASK: Task = QUEUE.get_task("work")


@pytest.fixture
def recorder(db: sa.Engine) -> Iterator[Recorder]:
    recorder = Recorder(db.execution_options(isolation_level="AUTOCOMMIT"), Reports(Observers([])))
    yield recorder
    recorder.close()


def enqueue(db: sa.Engine) -> int:
    with Session(db) as session, session.begin():
        return int(QUEUE.enqueue(session, "work"))


def claim(db: sa.Engine, recorder: Recorder, worker: str) -> Claimed:
    """Claim the one job, due now whatever its backoff said, as ``worker``."""
    with db.begin() as conn:
        conn.execute(sa.update(Job).where(Job.status == "queued").values(visible_at=sa.func.now()))
        (row,) = conn.execute(
            claiming.claim(), {"from_queue": "default", "limit": 1, "worker": worker}
        ).all()
    job = Claimed.of(row)
    recorder.reports.ran(job, job.run(), 0.01)
    return job


def history(db: sa.Engine, job_id: int) -> Any:
    with db.connect() as conn:
        return conn.execute(sa.select(Job.attempt_history).where(Job.id == job_id)).scalar_one()


def huge_error() -> ValueError:
    try:
        raise ValueError("x" * (MAX_ERROR_TRACEBACK + 5_000))
    except ValueError as exc:
        return exc


def test_two_failures_then_a_success_leave_two_entries(db: sa.Engine, recorder: Recorder) -> None:
    job_id = enqueue(db)
    recorder.record(claim(db, recorder, "w1"), Fail(huge_error()), TASK)
    recorder.record(claim(db, recorder, "w2"), Fail(KeyError("second")), TASK)
    recorder.record(claim(db, recorder, "w3"), Complete(batched=True), TASK)
    recorder.close()

    entries = history(db, job_id)
    assert [(e["attempt"], e["worker"], e["outcome"]) for e in entries] == [
        (1, "w1", "retried"),
        (2, "w2", "retried"),
    ]
    assert all(e["duration"] >= 0 and e["at"] for e in entries)
    first, second = (e["error"] for e in entries)
    assert first["type"] == "builtins.ValueError"
    assert len(first["message"]) < MAX_ERROR_MESSAGE + 50  # cut, with its note of how much
    assert len(first["traceback"]) < MAX_ERROR_TRACEBACK + 50
    assert first["traceback"].endswith("more characters]")
    assert second["type"] == "builtins.KeyError"
    with Session(db) as session:
        info = get_job(session, job_id)
    assert info is not None
    assert (info.status, info.attempts, info.attempt_history) == ("succeeded", 3, entries)


def test_the_last_failure_is_dead_and_a_requeue_keeps_the_history(
    db: sa.Engine, recorder: Recorder
) -> None:
    job_id = enqueue(db)
    for worker in ("a", "b", "c"):
        recorder.record(claim(db, recorder, worker), Fail(ValueError(worker)), TASK)
    assert [e["outcome"] for e in history(db, job_id)] == ["retried", "retried", "dead"]
    with Session(db) as session, session.begin():
        assert requeue_job(session, job_id)
    recorder.record(claim(db, recorder, "d"), Fail(ValueError("d")), TASK)
    entries = history(db, job_id)
    assert [(e["attempt"], e["error"]["message"]) for e in entries] == [
        (1, "a"),
        (2, "b"),
        (3, "c"),
        (4, "d"),
    ]


def test_a_stale_attempt_appends_nothing(db: sa.Engine, recorder: Recorder) -> None:
    job_id = enqueue(db)
    job = claim(db, recorder, "w1")
    with db.begin() as conn:  # another worker took the job over: this attempt is stale
        conn.execute(sa.update(Job).where(Job.id == job_id).values(attempts=job.attempts + 1))
    recorder.record(job, Fail(ValueError("late")), TASK)
    assert history(db, job_id) is None


def test_the_history_keeps_its_last_entries(db: sa.Engine, recorder: Recorder) -> None:
    job_id = enqueue(db)
    full = [{"attempt": n} for n in range(1, ATTEMPT_HISTORY_LIMIT + 1)]
    with db.begin() as conn:
        conn.execute(
            sa.update(Job)
            .where(Job.id == job_id)
            .values(attempt_history=full, attempts=ATTEMPT_HISTORY_LIMIT, max_attempts=100)
        )
    recorder.record(claim(db, recorder, "w"), Fail(ValueError("one more")), TASK)
    entries = history(db, job_id)
    assert len(entries) == ATTEMPT_HISTORY_LIMIT
    assert [e["attempt"] for e in entries] == list(range(2, ATTEMPT_HISTORY_LIMIT + 2))


def test_a_lease_found_expired_by_the_next_claim_leaves_an_entry(
    db: sa.Engine, recorder: Recorder
) -> None:
    job_id = enqueue(db)
    lost = claim(db, recorder, "gone")
    with db.begin() as conn:  # its worker vanished: the lease runs out
        conn.execute(
            sa.update(Job)
            .where(Job.id == job_id)
            .values(visible_at=sa.func.now() - sa.text("interval '1 second'"))
        )
    taken = claim(db, recorder, "next")
    assert taken.attempts == lost.attempts + 1
    recorder.record(lost, Fail(ValueError("late")), TASK)  # the lost attempt's own: stale
    (entry,) = history(db, job_id)
    assert (entry["attempt"], entry["worker"], entry["outcome"]) == (1, "gone", "lease_expired")
    assert entry["error"]["type"] == "LeaseExpired"
    assert entry["duration"] >= 0


def test_a_history_that_is_no_array_is_started_again(db: sa.Engine, recorder: Recorder) -> None:
    job_id = enqueue(db)
    with db.begin() as conn:  # written by hand: the failure must still be recorded
        conn.execute(
            sa.update(Job).where(Job.id == job_id).values(attempt_history={"not": "an array"})
        )
    recorder.record(claim(db, recorder, "w"), Fail(ValueError("boom")), TASK)
    assert [e["outcome"] for e in history(db, job_id)] == ["retried"]
