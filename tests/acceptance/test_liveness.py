"""Job timeouts and cancellation, in-process against a real PostgreSQL."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sa_jobqueue import Backoff, JobContext, JobQueue, Worker
from sa_jobqueue._deadlines import STATEMENT_DEADLINE
from sa_jobqueue._sql import claiming
from sa_jobqueue.database import CONTROL_SETTINGS, create_control_engine
from sa_jobqueue.errors import PayloadError
from sa_jobqueue.models import Job
from tests.acceptance.test_worker import EFFECTS, TABLES, effect_ids, make_due
from tests.helpers.jobs import burst, job
from tests.helpers.waiting import running, wait_for

__all__ = ["TABLES"]  # test_worker's effects table, which the ``db`` fixture creates

NO_RETRY_SOON = Backoff(base=timedelta(seconds=30), cap=timedelta(seconds=30), jitter=0)


def wait_until_stopped(ctx: JobContext, limit: float = 20) -> None:
    """What a well-behaved sync handler does: work in steps, checking the stop flag."""
    deadline = time.monotonic() + limit
    while not ctx.stop_requested:
        assert time.monotonic() < deadline, "the worker never asked this handler to stop"
        time.sleep(0.02)


def test_an_attempt_past_its_timeout_fails_and_cannot_complete(db: sa.Engine) -> None:
    queue = JobQueue()
    observed: list[bool] = []

    @queue.task(timeout=timedelta(seconds=0.5), max_attempts=2, backoff=NO_RETRY_SOON)
    def overrun(ctx: JobContext, payload: None) -> None:
        wait_until_stopped(ctx)
        observed.append(ctx.cancel_requested)
        ctx.session.execute(sa.insert(EFFECTS).values(job_id=ctx.job_id))  # too late

    with Session(db) as session, session.begin():
        job_id = queue.enqueue(session, "overrun")
    burst(queue, db)
    row = job(db, job_id)
    assert (row.status, row.attempts) == ("queued", 1)  # a failed attempt, retried later
    assert row.last_error["type"] == "builtins.TimeoutError"
    assert observed == [False]
    assert effect_ids(db) == []
    make_due(db, job_id)
    burst(queue, db)
    row = job(db, job_id)
    assert (row.status, row.attempts) == ("dead", 2)
    assert row.last_error["type"] == "builtins.TimeoutError"


def test_a_queued_job_can_be_cancelled_and_never_runs(db: sa.Engine) -> None:
    queue = JobQueue()
    ran: list[int] = []

    @queue.task
    def never(ctx: JobContext, payload: None) -> None:
        ran.append(ctx.job_id)

    with Session(db) as session, session.begin():
        job_id = queue.enqueue(session, "never")
        kept = queue.enqueue(session, "never")
    with Session(db) as session, session.begin():
        assert queue.cancel(session, job_id) is True
    with Session(db) as session, session.begin():
        assert queue.cancel(session, job_id) is False  # already finished
        assert queue.cancel(session, 10_000) is False  # no such job
    burst(queue, db)
    assert ran == [kept]
    row = job(db, job_id)
    assert (row.status, row.attempts) == ("cancelled", 0)
    assert row.finished_at is not None


def test_cancel_rolls_back_with_the_callers_transaction(db: sa.Engine) -> None:
    queue = JobQueue()

    @queue.task
    def noop(ctx: JobContext, payload: None) -> None:
        pass

    with Session(db) as session, session.begin():
        job_id = queue.enqueue(session, "noop")
    with Session(db) as session:
        assert queue.cancel(session, job_id) is True
        session.rollback()
    assert job(db, job_id).status == "queued"


def _run_and_cancel(db: sa.Engine, queue: JobQueue, task: str) -> int:
    with Session(db) as session, session.begin():
        job_id = queue.enqueue(session, task)
    with running(Worker(queue, db, concurrency=1, listen=False)):
        wait_for(lambda: job(db, job_id).status == "running", timeout=10)
        with Session(db) as session, session.begin():
            assert queue.cancel(session, job_id) is True
        wait_for(lambda: job(db, job_id).status != "running", timeout=15)
    return job_id


def test_a_running_job_sees_the_cancel_and_ends_cancelled(db: sa.Engine) -> None:
    queue = JobQueue()
    seen: list[bool] = []

    @queue.task(lease=timedelta(seconds=1.5))
    def patient(ctx: JobContext, payload: None) -> None:
        wait_until_stopped(ctx)
        seen.append(ctx.cancel_requested)
        ctx.session.execute(sa.insert(EFFECTS).values(job_id=ctx.job_id))

    job_id = _run_and_cancel(db, queue, "patient")
    row = job(db, job_id)
    assert (row.status, row.attempts) == ("cancelled", 1)
    assert seen == [True]
    assert effect_ids(db) == []  # the cancelled attempt's writes rolled back


def test_a_cancelled_job_that_raises_is_not_retried(db: sa.Engine) -> None:
    queue = JobQueue()

    @queue.task(lease=timedelta(seconds=1.5), max_attempts=5)
    def bails(ctx: JobContext, payload: None) -> None:
        wait_until_stopped(ctx)
        raise RuntimeError("stopping as asked")

    job_id = _run_and_cancel(db, queue, "bails")
    row = job(db, job_id)
    assert (row.status, row.attempts) == ("cancelled", 1)
    assert row.last_error["message"] == "stopping as asked"


def test_a_cancelled_job_whose_worker_died_is_not_run_again(db: sa.Engine) -> None:
    queue = JobQueue()
    ran: list[int] = []

    @queue.task
    def orphan(ctx: JobContext, payload: None) -> None:
        ran.append(ctx.job_id)

    with Session(db) as session, session.begin():
        job_id = queue.enqueue(session, "orphan")
    with db.begin() as conn:
        conn.execute(claiming.claim(), {"from_queue": "default", "limit": 1, "worker": "lost"})
    with Session(db) as session, session.begin():
        assert queue.cancel(session, job_id) is True
    make_due(db, job_id)
    burst(queue, db)
    assert ran == []
    row = job(db, job_id)
    assert (row.status, row.attempts) == ("cancelled", 1)


def test_a_lease_that_expired_while_its_row_was_locked_is_lost_not_renewed(db: sa.Engine) -> None:
    """The heartbeat skips a row another transaction holds locked and renews it later; once
    the lease has expired meanwhile it is lost, as if the job had been claimed again: the
    handler is told to stop, and the lease is not renewed."""
    queue = JobQueue()
    started, stopped = threading.Event(), threading.Event()

    @queue.task(lease=timedelta(seconds=1))
    def stalled(ctx: JobContext, payload: None) -> None:
        if ctx.attempt > 1:
            return  # reclaimed (see below): nothing to wait for
        started.set()
        wait_until_stopped(ctx)
        stopped.set()

    with Session(db) as session, session.begin():
        job_id = queue.enqueue(session, "stalled")
    lease_end = sa.select(Job.visible_at).where(Job.id == job_id)
    with running(Worker(queue, db, concurrency=1, poll_interval=timedelta(seconds=0.2))):
        assert started.wait(20)
        with db.connect() as locker, locker.begin():  # an application transaction, say
            locker.execute(lease_end.with_for_update())
            with db.execution_options(isolation_level="AUTOCOMMIT").connect() as clock:
                expired = sa.select(Job.visible_at <= sa.func.now()).where(Job.id == job_id)
                wait_for(lambda: clock.execute(expired).scalar_one(), timeout=10)
            # Not renewed while locked; lost once expired, and its handler told so.
            assert stopped.wait(10), "the handler was never told its lease was lost"
            with db.execution_options(isolation_level="AUTOCOMMIT").connect() as clock:
                assert clock.execute(expired).scalar_one()  # and still not renewed
        wait_for(lambda: job(db, job_id).status != "running", timeout=15)
    # Its completion ends it, unless the worker's own next claim took the expired lease first
    # (a freed thread claims at once; on a loaded machine that can beat the batched
    # completion): then the second attempt, fenced apart from the first, ends it.
    row = job(db, job_id)
    assert row.status == "succeeded"
    assert row.attempts in (1, 2)


def test_the_workers_own_connections_carry_statement_and_lock_timeouts(
    database_url: URL,
) -> None:
    control = create_control_engine(database_url, concurrency=4)
    try:
        with control.connect() as conn:
            settings = {
                name: conn.exec_driver_sql(f"SHOW {name}").scalar_one()
                for name in (
                    "statement_timeout",
                    "lock_timeout",
                    "idle_in_transaction_session_timeout",
                )
            }
    finally:
        control.dispose()
    assert settings == CONTROL_SETTINGS
    # The server's own limit answers before the worker's client-side deadline cuts in.
    assert int(settings["statement_timeout"].removesuffix("s")) < STATEMENT_DEADLINE


def test_the_workers_own_connections_keep_the_urls_server_options(database_url: URL) -> None:
    """A search_path given in the URL reaches the claim's connections too, timeouts added."""
    url = database_url.update_query_dict({"options": "-c search_path=elsewhere,public"})
    control = create_control_engine(url, concurrency=1)
    try:
        with control.connect() as conn:
            path = conn.exec_driver_sql("SHOW search_path").scalar_one()
            timeout = conn.exec_driver_sql("SHOW statement_timeout").scalar_one()
    finally:
        control.dispose()
    assert (path, timeout) == ("elsewhere,public", CONTROL_SETTINGS["statement_timeout"])


def test_a_payload_python_cannot_decode_goes_dead_without_hurting_its_batch(
    db: sa.Engine,
) -> None:
    queue = JobQueue()
    ran: list[int] = []

    @queue.task
    def ordinary(ctx: JobContext, payload: object) -> None:
        ran.append(ctx.job_id)

    with Session(db) as session, session.begin():
        ids = queue.enqueue_many(session, "ordinary", [1, 2, 3])
    # Valid jsonb, but nested deeper than Python's recursion limit lets json.loads go. Written
    # with SQL, as another producer (or a hand-made row) could.
    with db.begin() as conn:
        poison = conn.execute(
            sa.text(
                "INSERT INTO sa_jobqueue_jobs (task, payload)"
                " VALUES ('ordinary', (repeat('[', 5000) || repeat(']', 5000))::jsonb)"
                " RETURNING id"
            )
        ).scalar_one()
    burst(queue, db, concurrency=8)
    assert sorted(ran) == ids
    with db.connect() as conn:  # not the payload: the test's own driver could not decode it
        row = conn.execute(
            sa.select(Job.status, Job.attempts, Job.last_error).where(Job.id == poison)
        ).one()
    assert (row.status, row.attempts) == ("dead", 1)
    assert row.last_error["type"] == "sa_jobqueue.errors.PayloadError"
    assert "could not be decoded" in row.last_error["message"]


def test_enqueue_refuses_a_payload_nested_too_deeply(db: sa.Engine) -> None:
    queue = JobQueue()

    @queue.task
    def deep(ctx: JobContext, payload: object) -> None:  # pragma: no cover - never runs
        pass

    nested: list[object] = []
    for _ in range(5000):
        nested = [nested]
    with Session(db) as session, pytest.raises(PayloadError, match="nested too deeply"):
        queue.enqueue(session, "deep", nested)


def test_an_async_handler_past_its_timeout_is_cancelled(db: sa.Engine) -> None:
    queue = JobQueue()
    outcomes: list[str] = []

    @queue.task(timeout=timedelta(seconds=0.5), max_attempts=1)
    async def sleepy(ctx: JobContext, payload: None) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            outcomes.append("cancelled")
            raise
        outcomes.append("finished")  # pragma: no cover - the test fails if reached

    with Session(db) as session, session.begin():
        job_id = queue.enqueue(session, "sleepy")
    started = time.monotonic()
    burst(queue, db)
    assert time.monotonic() - started < 10  # the thread was freed, not held for 30 s
    assert outcomes == ["cancelled"]
    row = job(db, job_id)
    assert (row.status, row.attempts) == ("dead", 1)
    assert row.last_error["type"] == "builtins.TimeoutError"


def test_an_async_handler_runs_and_its_session_writes_commit(db: sa.Engine) -> None:
    queue = JobQueue()

    @queue.task
    async def writer(ctx: JobContext, payload: str) -> None:
        await asyncio.sleep(0)
        ctx.session.execute(sa.insert(EFFECTS).values(job_id=ctx.job_id, note=payload))

    with Session(db) as session, session.begin():
        job_id = queue.enqueue(session, "writer", "hi")
    burst(queue, db)
    assert job(db, job_id).status == "succeeded"
    assert effect_ids(db) == [job_id]
