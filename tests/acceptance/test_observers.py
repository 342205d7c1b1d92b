"""Observers hear of every attempt once: started, then finished with its recorded outcome."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta

import sqlalchemy as sa
from sqlalchemy.orm import Session

from sa_jobqueue import Backoff, JobContext, JobQueue, Worker
from sa_jobqueue.observability import JobRun, Observer


class OutcomeRecorder(Observer):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.starts: Counter[tuple[int, int]] = Counter()
        self.outcomes: list[tuple[int, int, str, float | None, str | None]] = []

    def started(self, job: JobRun) -> None:
        with self.lock:
            self.starts[job.id, job.attempt] += 1

    def finished(
        self, job: JobRun, outcome: str, run_time: float | None, error: BaseException | None
    ) -> None:
        with self.lock:
            kind = type(error).__name__ if error is not None else None
            self.outcomes.append((job.id, job.attempt, outcome, run_time, kind))


class Broken(Observer):
    def started(self, job: JobRun) -> None:
        raise RuntimeError("an observer with a bug")

    def finished(
        self, job: JobRun, outcome: str, run_time: float | None, error: BaseException | None
    ) -> None:
        raise RuntimeError("an observer with a bug")


TABLES = "CREATE TABLE effects (n int)"


def test_each_attempt_is_reported_once_with_its_outcome(db: sa.Engine) -> None:
    queue = JobQueue()
    fast = Backoff(base=timedelta(milliseconds=10), jitter=0)

    @queue.task
    def noop(ctx: JobContext, n: int) -> None:
        pass

    @queue.task
    def write(ctx: JobContext, n: int) -> None:
        ctx.session.execute(sa.text("INSERT INTO effects VALUES (:n)"), {"n": n})

    @queue.task(max_attempts=2, backoff=fast)
    def fails(ctx: JobContext, n: int) -> None:
        raise ValueError("always")

    @queue.task(max_attempts=1, timeout=timedelta(seconds=0.3))
    def overruns(ctx: JobContext, n: int) -> None:
        while not ctx.stop_requested:
            threading.Event().wait(0.01)

    with Session(db) as session:
        noops = queue.enqueue_many(session, "noop", list(range(50)))
        writes = queue.enqueue_many(session, "write", list(range(50)))
        failing = queue.enqueue(session, "fails", 0)
        overrun = queue.enqueue(session, "overruns", 0)
        session.commit()
    with db.begin() as conn:  # a job no worker knows the task of
        conn.exec_driver_sql(
            "INSERT INTO sa_jobqueue_jobs (task, payload, queue) VALUES ('gone', '1', 'default')"
        )
        unknown = conn.exec_driver_sql("SELECT max(id) FROM sa_jobqueue_jobs").scalar_one()

    recorder = OutcomeRecorder()
    Worker(
        queue, db, concurrency=4, listen=False, retention=None, observers=[Broken(), recorder]
    ).run(burst=True)

    outcomes = {(job_id, attempt): outcome for job_id, attempt, outcome, _, _ in recorder.outcomes}
    assert len(outcomes) == len(recorder.outcomes)  # never two reports for one attempt
    assert all(outcomes[n, 1] == "succeeded" for n in [*noops, *writes])
    assert outcomes[failing, 1] == "retried"
    assert outcomes[failing, 2] == "dead"
    assert outcomes[overrun, 1] == "dead"
    assert outcomes[unknown, 1] == "retried"  # a rolling deploy's job: retried with backoff
    # Every attempt that ran was started once; the unknown task's never ran.
    assert set(recorder.starts) == set(outcomes) - {(unknown, 1)}
    assert set(recorder.starts.values()) == {1}
    errors = {(j, a): kind for j, a, _, _, kind in recorder.outcomes}
    assert errors[failing, 2] == "ValueError"
    assert errors[overrun, 1] == "TimeoutError"
    assert errors[unknown, 1] == "UnknownTaskError"
    assert all(
        run_time is not None and run_time >= 0
        for job_id, _, _, run_time, _ in recorder.outcomes
        if job_id != unknown
    )
