"""Unique modes and periods with many transactions: eight enqueuers at once, and claims.

Each enqueuer runs in a thread with its own Session and transaction; a barrier starts their
enqueues together, and each commits as soon as its enqueue returns. (A barrier before the
commits would deadlock: an enqueuer whose key another one has just inserted waits for that
transaction inside its INSERT.) What must hold is what some serial order of the eight would
give: one live job per key, every enqueuer told the same id, exactly one ``created`` in a
round that added the job, and the final row written by the last transaction that wrote it.
That transaction is found by the row's ``xmin``, so the test needs no assumption about the
order in which the threads happened to run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event, func, literal_column, select
from sqlalchemy.orm import Session

from sa_jobqueue import Enqueued, JobQueue
from sa_jobqueue._sql import claiming
from sa_jobqueue.models import jobs_table
from tests.acceptance.test_unique_jobs import (
    _waiting_for_a_lock,
    finish,
    live,
    other_engine,
    set_running,
)
from tests.helpers.jobs import handler
from tests.helpers.notify import listening, notifications
from tests.helpers.waiting import wait_for

__all__ = ["other_engine"]  # the fixture: a second engine on the test's database

j = jobs_table.c
ENQUEUERS = 8


@pytest.fixture
def queue() -> JobQueue:
    queue = JobQueue()
    queue.task(name="replace", queue="a", unique_mode="replace")(handler)
    queue.task(name="debounce", queue="a", unique_mode="debounce", debounce=timedelta(minutes=5))(
        handler
    )
    # Windows of 1,000 days: a round of the test never straddles two of them (the hourly
    # windows are checked in tests/integration, inside one transaction).
    queue.task(name="period", queue="a", unique_period=timedelta(days=1000))(handler)
    return queue


@dataclass(frozen=True)
class Call:
    """One enqueuer's call: what it got, its transaction's id and its ``now()``."""

    index: int
    job: Enqueued
    xid: int
    now: datetime


def race(engine: sa.Engine, enqueue: Callable[[Session, int], Enqueued]) -> list[Call]:
    """Run ``enqueue(session, index)`` in :data:`ENQUEUERS` threads at once, each in its own
    transaction, committed right after the call; their calls in index order."""
    barrier = threading.Barrier(ENQUEUERS)
    calls: list[Call | None] = [None] * ENQUEUERS
    errors: list[BaseException] = []

    def enqueuer(index: int) -> None:
        try:
            with Session(engine) as session, session.begin():
                # The transaction's id (mod 2**32, as xmin shows it) and its clock.
                xid, now = session.execute(select(func.txid_current() % 2**32, func.now())).one()
                barrier.wait(timeout=30)
                job = enqueue(session, index)
            calls[index] = Call(index, job, xid, now)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=enqueuer, args=(i,)) for i in range(ENQUEUERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert all(call is not None for call in calls)
    return [call for call in calls if call is not None]


def final_row(engine: sa.Engine, job_id: int) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            select(
                j.payload,
                j.priority,
                j.visible_at,
                j.status,
                literal_column("xmin::text::bigint").label("xmin"),
            ).where(j.id == job_id)
        ).one()


# -- replace ------------------------------------------------------------------------------------


def test_replace_under_eight_concurrent_enqueuers(engine: sa.Engine, queue: JobQueue) -> None:
    for round_ in range(3):

        def enqueue(session: Session, index: int, round_: int = round_) -> Enqueued:
            return queue.enqueue(
                session,
                "replace",
                {"t": index, "r": round_},
                unique_key="hot",
                priority=index,
                run_at=timedelta(minutes=index + 1),
            )

        calls = race(engine, enqueue)
        (job_id,) = {call.job for call in calls}
        assert live(engine, "replace", "hot") == [job_id]
        created = [call for call in calls if call.job.created]
        updated = [call for call in calls if call.job.updated]
        # The first round adds the job; later ones find it queued. Each call either added it
        # or replaced it: none was skipped, since the job never ran.
        assert len(created) == (1 if round_ == 0 else 0)
        assert len(created) + len(updated) == ENQUEUERS
        # The row is what the last writer wrote, whole: payload, priority and due time.
        row = final_row(engine, job_id)
        (last,) = [call for call in calls if call.xid == row.xmin]
        assert row.payload == {"t": last.index, "r": round_}
        assert row.priority == last.index
        assert row.visible_at == last.now + timedelta(minutes=last.index + 1)
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).where(j.task == "replace")).scalar_one() == 1


def test_debounce_under_eight_concurrent_enqueuers(engine: sa.Engine, queue: JobQueue) -> None:
    def enqueue(session: Session, index: int) -> Enqueued:
        # Every other enqueuer gives its own delay, shorter or longer than the task's 5 minutes.
        delay = timedelta(minutes=index) if index % 2 else None
        return queue.enqueue(session, "debounce", {"t": index}, unique_key="hot", run_at=delay)

    calls = race(engine, enqueue)
    (job_id,) = {call.job for call in calls}
    assert [call.job.created for call in calls].count(True) == 1
    assert all(call.job.created or call.job.updated for call in calls)
    row = final_row(engine, job_id)
    # Only ever later: the due time is the latest any enqueuer asked for.
    asked = [call.now + timedelta(minutes=call.index if call.index % 2 else 5) for call in calls]
    assert row.visible_at == max(asked)
    (last,) = [call for call in calls if call.xid == row.xmin]
    assert row.payload == {"t": last.index}
    assert live(engine, "debounce", "hot") == [job_id]


@pytest.mark.parametrize("mode", ["replace", "debounce"])
def test_eight_concurrent_enqueuers_never_touch_a_running_job(
    engine: sa.Engine, queue: JobQueue, mode: str
) -> None:
    with Session(engine) as session, session.begin():
        first = queue.enqueue(session, mode, {"t": "first"}, unique_key="hot")
    set_running(engine, first)
    before = final_row(engine, first)

    def enqueue(session: Session, index: int) -> Enqueued:
        return queue.enqueue(session, mode, {"t": index}, unique_key="hot", priority=9)

    calls = race(engine, enqueue)
    assert {(call.job, call.job.created, call.job.updated) for call in calls} == {
        (first, False, False)
    }
    assert final_row(engine, first) == before  # not even a new row version (same xmin)
    assert live(engine, mode, "hot") == [first]


# -- a claim racing a replace -------------------------------------------------------------------


def _before_the_update(engine: sa.Engine, action: Callable[[], None]) -> None:
    """Run ``action`` once, just before ``engine`` sends a replace's UPDATE."""
    done: list[bool] = []

    def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.startswith("UPDATE sa_jobqueue_jobs SET payload") and not done:
            done.append(True)
            action()

    event.listen(engine, "before_cursor_execute", before)


def _claim(conn: sa.Connection) -> list[Any]:
    params = {"from_queue": "a", "limit": 10, "worker": "w"}
    return list(conn.execute(claiming.claim(), params).all())


def test_a_job_claimed_between_the_insert_and_the_update_is_left_alone(
    engine: sa.Engine, other_engine: sa.Engine, queue: JobQueue
) -> None:
    with Session(engine) as session, session.begin():
        first = queue.enqueue(session, "replace", {"t": "first"}, unique_key="k")

    def claim_committed() -> None:
        with other_engine.connect() as conn:
            assert [row.id for row in _claim(conn)] == [first]

    _before_the_update(engine, claim_committed)
    with Session(engine) as session, session.begin():
        again = queue.enqueue(session, "replace", {"t": "again"}, unique_key="k")
    assert (again, again.created, again.updated) == (first, False, False)
    row = final_row(engine, first)
    assert (row.status, row.payload) == ("running", {"t": "first"})


def test_a_replace_waits_for_a_claim_in_progress_and_then_leaves_the_job_alone(
    engine: sa.Engine, database_url: Any, queue: JobQueue
) -> None:
    """The claim has locked the row (not yet committed) when the UPDATE runs: the UPDATE
    waits for it, reads the row again once the claim commits, finds it running, and changes
    nothing."""
    with Session(engine) as session, session.begin():
        first = queue.enqueue(session, "replace", {"t": "first"}, unique_key="k")
    claimer = sa.create_engine(database_url)
    claim_conn = claimer.connect()
    committer_errors: list[BaseException] = []

    def commit_once_the_update_waits() -> None:
        try:
            wait_for(lambda: _waiting_for_a_lock(claimer))
            claim_conn.commit()
        except BaseException as exc:
            committer_errors.append(exc)

    committer = threading.Thread(target=commit_once_the_update_waits)

    def claim_in_progress() -> None:
        assert [row.id for row in _claim(claim_conn)] == [first]  # locked, not committed
        committer.start()

    try:
        _before_the_update(engine, claim_in_progress)
        with Session(engine) as session, session.begin():
            again = queue.enqueue(session, "replace", {"t": "again"}, unique_key="k")
        committer.join(30)
    finally:
        claim_conn.close()
        claimer.dispose()
    assert not committer_errors, committer_errors
    assert (again, again.created, again.updated) == (first, False, False)
    row = final_row(engine, first)
    assert (row.status, row.payload) == ("running", {"t": "first"})


def test_a_replaced_job_is_not_claimed_before_the_replacing_transaction_commits(
    engine: sa.Engine, other_engine: sa.Engine, queue: JobQueue
) -> None:
    with Session(engine) as session, session.begin():
        first = queue.enqueue(session, "replace", {"t": "first"}, unique_key="k")
    with Session(engine) as session:
        assert queue.enqueue(session, "replace", {"t": "second"}, unique_key="k").updated
        with other_engine.connect() as conn:
            assert _claim(conn) == []  # the row is locked by the replace: SKIP LOCKED
        session.commit()
    with other_engine.connect() as conn:
        (claimed,) = _claim(conn)
    assert claimed.id == first
    assert final_row(engine, first).payload == {"t": "second"}


# -- unique periods -----------------------------------------------------------------------------


def test_a_period_under_eight_concurrent_enqueuers_holds_after_the_job_finished(
    engine: sa.Engine, queue: JobQueue
) -> None:
    def enqueue(session: Session, index: int) -> Enqueued:
        return queue.enqueue(session, "period", {"t": index}, unique_key="hot")

    calls = race(engine, enqueue)
    (job_id,) = {call.job for call in calls}
    assert [call.job.created for call in calls].count(True) == 1
    finish(engine, job_id)
    again = race(engine, enqueue)
    assert {(call.job, call.job.created, call.job.updated) for call in again} == {
        (job_id, False, False)
    }
    assert live(engine, "period", "hot") == []
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).where(j.task == "period")).scalar_one() == 1


# -- wake-ups -----------------------------------------------------------------------------------


def test_a_replace_that_makes_the_job_due_wakes_the_queue_at_commit(
    engine: sa.Engine, queue: JobQueue
) -> None:
    with Session(engine) as session, session.begin():
        queue.enqueue(session, "replace", {}, unique_key="k", run_at=timedelta(hours=1))
        queue.enqueue(session, "debounce", {}, unique_key="d")
    with listening(engine) as listener:
        notifications(listener, engine)  # drop the enqueues' own
        with Session(engine) as session, session.begin():
            # Still due later, or pushed later: nothing to wake a worker for.
            assert queue.enqueue(
                session, "replace", {}, unique_key="k", run_at=timedelta(minutes=30)
            ).updated
            assert queue.enqueue(session, "debounce", {}, unique_key="d").updated
        assert notifications(listener, engine) == []
        with Session(engine) as session:
            assert queue.enqueue(session, "replace", {"now": True}, unique_key="k").updated
            session.rollback()
        assert notifications(listener, engine) == []  # rolled back: no wake-up
        with Session(engine) as session, session.begin():
            assert queue.enqueue(session, "replace", {"now": True}, unique_key="k").updated
            jobs = queue.enqueue_many(session, "replace", [{}, {}], unique_keys=["k", "new"])
            assert [(job.created, job.updated) for job in jobs] == [(False, True), (True, False)]
        assert notifications(listener, engine) == ["a"]  # once, at commit


def test_aenqueue_replaces_too(engine: sa.Engine, database_url: Any, queue: JobQueue) -> None:
    import asyncio

    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    async def scenario() -> tuple[Enqueued, Enqueued]:
        async_engine = create_async_engine(database_url)
        try:
            async with AsyncSession(async_engine) as session, session.begin():
                first = await queue.aenqueue(session, "replace", {"n": 1}, unique_key="k")
                second = await queue.aenqueue(session, "replace", {"n": 2}, unique_key="k")
            return first, second
        finally:
            await async_engine.dispose()

    first, second = asyncio.run(scenario())
    assert (first.created, second, second.updated) == (True, first, True)
    assert final_row(engine, first).payload == {"n": 2}
