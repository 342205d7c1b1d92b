"""Handlers steer their jobs: Retry(after) runs one again later, unfailed; Discard ends it."""

from __future__ import annotations

import functools
import threading
import time
from datetime import timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from sa_jobqueue import Backoff, Discard, InvalidJobError, JobContext, JobQueue, Retry, Worker
from sa_jobqueue.models import Job
from sa_jobqueue.ops.admin import cancel_job
from tests.helpers.jobs import burst
from tests.helpers.waiting import running, wait_for

TABLES = "CREATE TABLE effects (job_id bigint, attempt int)"
drain = functools.partial(burst, concurrency=1, retention=None)


def retry_state(engine: sa.Engine, job_id: int) -> sa.Row[tuple[str, int, int, object, float]]:
    with engine.connect() as conn:
        return conn.execute(
            sa.select(
                Job.status,
                Job.attempts,
                Job.max_attempts,
                Job.last_error,
                sa.func.extract("epoch", Job.visible_at - sa.func.now()).label("due_in"),
            ).where(Job.id == job_id)
        ).one()


def effect_attempts(engine: sa.Engine) -> list[tuple[int, int]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.exec_driver_sql("SELECT job_id, attempt FROM effects")]


def write(ctx: JobContext) -> None:
    ctx.session.execute(
        sa.text("INSERT INTO effects VALUES (:j, :a)"), {"j": ctx.job_id, "a": ctx.attempt}
    )


def test_retry_reschedules_without_a_failure_and_rolls_back_writes(db: sa.Engine) -> None:
    queue = JobQueue()

    @queue.task(max_attempts=3)
    def poll(ctx: JobContext, payload: None) -> None:
        write(ctx)
        if ctx.attempt == 1:
            raise Retry(after=timedelta(minutes=10), reason="not ready yet")

    with Session(db) as session:
        job_id = queue.enqueue(session, poll, None)
        session.commit()
    drain(queue, db)

    status, attempts, max_attempts, last_error, due_in = retry_state(db, job_id)
    assert (status, attempts, max_attempts, last_error) == ("queued", 1, 3, None)
    assert 590 < due_in <= 600  # ten minutes on the database's clock, no backoff, no jitter
    assert effect_attempts(db) == []

    with db.begin() as conn:
        conn.execute(sa.update(Job).where(Job.id == job_id).values(visible_at=sa.func.now()))
    drain(queue, db)
    assert retry_state(db, job_id)[:4] == ("succeeded", 2, 3, None)
    assert effect_attempts(db) == [(job_id, 2)]


def test_retry_on_the_last_attempt_grants_one_more(db: sa.Engine) -> None:
    queue = JobQueue()

    @queue.task(max_attempts=1)
    def once_more(ctx: JobContext, payload: None) -> None:
        if ctx.attempt == 1:
            raise Retry()

    with Session(db) as session:
        job_id = queue.enqueue(session, once_more, None)
        session.commit()
    drain(queue, db)  # Retry() is due at once: the same drain runs the second attempt

    assert retry_state(db, job_id)[:4] == ("succeeded", 2, 2, None)


def test_discard_sends_the_job_to_dead_at_once_with_its_reason(db: sa.Engine) -> None:
    queue = JobQueue()

    @queue.task(max_attempts=5)
    def hopeless(ctx: JobContext, payload: None) -> None:
        write(ctx)
        raise Discard("the account was deleted")

    with Session(db) as session:
        job_id = queue.enqueue(session, hopeless, None)
        session.commit()
    drain(queue, db)

    status, attempts, max_attempts, last_error, _ = retry_state(db, job_id)
    assert (status, attempts, max_attempts) == ("dead", 1, 5)
    assert isinstance(last_error, dict)
    assert last_error["type"] == "sa_jobqueue.tasks.Discard"
    assert last_error["message"] == "the account was deleted"
    assert effect_attempts(db) == []


def test_a_cancelled_job_whose_handler_then_discards_it_ends_cancelled(db: sa.Engine) -> None:
    """cancel() promises a running job ends cancelled however its handler ends: Discard too.

    Its dependents are settled as after a cancellation (cancelled, by default) in the same
    statement.
    """
    queue = JobQueue()
    started = threading.Event()

    # A short lease: the heartbeat renews it (and passes the cancellation on) every 0.5 s.
    @queue.task(lease=timedelta(seconds=1.5))
    def gives_up_when_cancelled(ctx: JobContext, payload: None) -> None:
        write(ctx)
        started.set()
        deadline = time.monotonic() + 30
        while not ctx.cancel_requested and time.monotonic() < deadline:
            time.sleep(0.02)  # the handler's own poll of its flag, as a real handler's
        raise Discard("cancelled, so no point going on")

    @queue.task
    def after(ctx: JobContext, payload: None) -> None:
        write(ctx)

    with Session(db) as session:
        job_id = queue.enqueue(session, gives_up_when_cancelled, None)
        dependent = queue.enqueue(session, after, None, depends_on=[job_id])
        session.commit()
    with running(Worker(queue, db, concurrency=1, poll_interval=timedelta(seconds=0.1))):
        assert started.wait(20)
        with Session(db) as session:
            assert cancel_job(session, job_id) is True
            session.commit()
        wait_for(lambda: retry_state(db, job_id)[0] != "running", timeout=20)

    status, attempts, _, last_error, _ = retry_state(db, job_id)
    assert (status, attempts) == ("cancelled", 1), last_error
    assert retry_state(db, dependent)[0] == "cancelled"
    assert effect_attempts(db) == []


def test_a_job_enqueued_with_its_own_backoff_retries_on_it(db: sa.Engine) -> None:
    queue = JobQueue()

    @queue.task(
        max_attempts=3,
        backoff=Backoff(base=timedelta(hours=1), cap=timedelta(hours=2), jitter=0),
    )
    def flaky(ctx: JobContext, payload: None) -> None:
        raise ValueError("down")

    own = Backoff(base=timedelta(seconds=100), cap=timedelta(hours=2), jitter=0)
    with Session(db) as session:
        default = queue.enqueue(session, flaky, None)
        single = queue.enqueue(session, flaky, None, backoff=own)
        (bulk,) = queue.enqueue_many(session, flaky, [None], backoff=own)
        session.commit()
    drain(queue, db)

    due = {job_id: retry_state(db, job_id)[4] for job_id in (default, single, bulk)}
    assert 3590 < due[default] <= 3600
    assert 90 < due[single] <= 100
    assert 90 < due[bulk] <= 100


def test_a_backoff_that_is_not_a_backoff_is_refused(db: sa.Engine) -> None:
    queue = JobQueue()

    @queue.task
    def noop(ctx: JobContext, payload: None) -> None:
        pass

    with Session(db) as session, pytest.raises(InvalidJobError, match="Backoff"):
        queue.enqueue(session, noop, None, backoff=timedelta(seconds=1))  # type: ignore[arg-type]
