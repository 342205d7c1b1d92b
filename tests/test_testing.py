"""sa_jobqueue.testing: the helpers users write their own tests with.

Each helper is checked both ways: it passes on what it should accept, and it fails, with a
message that says what was found, on what it should not. ``drain`` is run against committed
jobs in a database of the test's own.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from unittest.mock import ANY

import pytest
import sqlalchemy as sa
from sqlalchemy import func, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sa_jobqueue import Backoff, InvalidJobError, JobContext, JobQueue, JobQueueError, PayloadError
from sa_jobqueue.models import jobs_table, periodic_table
from sa_jobqueue.testing import (
    DrainResult,
    assert_enqueued,
    drain,
    enqueued_jobs,
    refute_enqueued,
    run_task,
)


class AppBase(DeclarativeBase):
    pass


class Note(AppBase):
    __tablename__ = "testing_notes"

    id: Mapped[int] = mapped_column(primary_key=True)
    text: Mapped[str]


queue = JobQueue()


@queue.task
def write_note(ctx: JobContext, payload: dict[str, str]) -> str:
    ctx.session.add(Note(text=payload["text"]))
    return f"wrote {payload['text']}"


@queue.task(queue="emails", max_attempts=3)
def describe(ctx: JobContext, payload: Any) -> dict[str, Any]:
    return {
        "job_id": ctx.job_id,
        "task": ctx.task,
        "queue": ctx.queue,
        "attempt": ctx.attempt,
        "max_attempts": ctx.max_attempts,
        "payload": payload,
    }


@queue.task
async def describe_async(ctx: JobContext, payload: Any) -> str:
    return f"async {payload} attempt {ctx.attempt}"


@queue.task(max_attempts=3, backoff=Backoff(base=timedelta(hours=1), cap=timedelta(hours=2)))
def write_then_fail(ctx: JobContext, payload: Any) -> None:
    ctx.session.add(Note(text="from a failing attempt"))
    ctx.session.flush()
    raise RuntimeError(f"boom {ctx.attempt}")


@queue.task
def committing(ctx: JobContext, payload: Any) -> None:
    ctx.session.add(Note(text="committed by the handler?"))
    ctx.session.commit()


@queue.task
def chain(ctx: JobContext, payload: dict[str, int]) -> None:
    """Write a note and enqueue the next link, ``left`` times (forever if ``left`` < 0)."""
    ctx.session.add(Note(text=f"link {payload['left']}"))
    if payload["left"] != 0:
        queue.enqueue(ctx.session, chain, {"left": payload["left"] - 1})


@queue.periodic("* * * * *")
@queue.task
def every_minute(ctx: JobContext, payload: Any) -> None:
    pass


@pytest.fixture
def app_engine(engine: sa.Engine) -> sa.Engine:
    AppBase.metadata.create_all(engine)
    return engine


@pytest.fixture
def session(app_engine: sa.Engine) -> Iterator[Session]:
    """A Session on one connection whose transaction is rolled back after the test."""
    with app_engine.connect() as conn:
        transaction = conn.begin()
        with Session(bind=conn, join_transaction_mode="create_savepoint") as session:
            yield session
        transaction.rollback()


def notes(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(select(Note.text).order_by(Note.id)).scalars())


# -- enqueued_jobs, assert_enqueued, refute_enqueued ------------------------------------------


def test_assert_enqueued_sees_an_uncommitted_enqueue_of_the_same_transaction(
    session: Session, app_engine: sa.Engine
) -> None:
    job_id = queue.enqueue(session, write_note, {"text": "hi"})

    job = assert_enqueued(session, task=write_note, payload={"text": "hi"})

    assert (job.id, job.task, job.queue, job.status) == (job_id, "write_note", "default", "queued")
    assert enqueued_jobs(session) == [job]
    refute_enqueued(app_engine)  # an Engine reads committed jobs only: there are none


def test_assert_enqueued_names_the_payload_it_wanted_and_the_jobs_it_found(
    session: Session,
) -> None:
    queue.enqueue(session, write_note, {"text": "hi"})
    queue.enqueue(session, describe, [1, 2])

    with pytest.raises(AssertionError) as raised:
        assert_enqueued(session, task="write_note", payload={"text": "bye"})

    message = str(raised.value)
    assert message.startswith(
        "expected a queued job of task 'write_note' with payload {'text': 'bye'}, found none;"
    )
    assert re.search(
        r"#\d+ write_note queue='default' status=queued payload=\{'text': 'hi'\}", message
    )
    assert re.search(r"#\d+ describe queue='emails' status=queued payload=\[1, 2\]", message)


def test_assert_enqueued_fails_on_an_empty_table_and_on_other_filters(session: Session) -> None:
    with pytest.raises(AssertionError, match="found none; no queued jobs at all"):
        assert_enqueued(session, task=write_note)
    queue.enqueue(session, write_note, {"text": "hi"})
    with pytest.raises(AssertionError, match="in queue 'emails'"):
        assert_enqueued(session, task=write_note, queue="emails")
    with pytest.raises(AssertionError, match="expected a succeeded job of task 'write_note'"):
        assert_enqueued(session, task=write_note, status="succeeded")
    assert_enqueued(session, task=write_note, status=None)
    assert_enqueued(session, task=write_note, status=["queued", "running"], queue="default")


def test_assert_enqueued_matches_any_inside_a_payload_and_counts(session: Session) -> None:
    queue.enqueue_many(session, write_note, [{"text": "a"}, {"text": "b"}, {"text": "a"}])

    assert_enqueued(session, task=write_note, payload={"text": ANY}, count=3)
    newest = assert_enqueued(session, task=write_note, payload={"text": "a"}, count=2)
    assert newest.id == max(job.id for job in enqueued_jobs(session))
    with pytest.raises(AssertionError) as raised:
        assert_enqueued(session, task=write_note, payload={"text": "a"}, count=1)
    assert str(raised.value).startswith(
        "expected 1 of (queued job of task 'write_note' with payload {'text': 'a'}), found 2:\n  #"
    )
    with pytest.raises(InvalidJobError, match="refute_enqueued"):
        assert_enqueued(session, task=write_note, count=0)
    with pytest.raises(AssertionError):
        assert_enqueued(session, task=write_note, payload={"text": "a", "extra": ANY})


def test_refute_enqueued_lists_the_jobs_that_match(session: Session) -> None:
    refute_enqueued(session, task=write_note)
    queue.enqueue(session, write_note, {"text": "hi"})
    refute_enqueued(session, task=write_note, payload={"text": "other"})
    refute_enqueued(session, task=describe)

    with pytest.raises(AssertionError) as raised:
        refute_enqueued(session, task=write_note)
    assert re.fullmatch(
        r"expected no queued job of task 'write_note', found 1:\n"
        r"  #\d+ write_note queue='default' status=queued payload=\{'text': 'hi'\}",
        str(raised.value),
    )


def test_enqueued_jobs_refuses_an_unknown_status(session: Session) -> None:
    with pytest.raises(InvalidJobError, match="unknown status 'done'"):
        enqueued_jobs(session, status="done")


# -- run_task ---------------------------------------------------------------------------------


def test_run_task_gives_the_handler_a_context_and_a_decoded_payload() -> None:
    payload = {"ids": [1, 2]}
    result = run_task(describe, payload, job_id=42, attempt=2)

    assert result == {
        "job_id": 42,
        "task": "describe",
        "queue": "emails",
        "attempt": 2,
        "max_attempts": 3,
        "payload": {"ids": [1, 2]},
    }
    assert result["payload"] is not payload  # decoded from JSON, as a worker would
    assert run_task(describe_async, "x", attempt=3, max_attempts=4) == "async x attempt 3"


def test_run_task_refuses_what_enqueue_would(session: Session) -> None:
    with pytest.raises(PayloadError):
        run_task(describe, {"ids": (1, 2)})
    with pytest.raises(InvalidJobError, match="attempt must be from 1 to max_attempts"):
        run_task(describe, None, attempt=4)


def test_run_task_writes_into_the_callers_transaction_without_committing(
    session: Session, app_engine: sa.Engine
) -> None:
    assert run_task(write_note, {"text": "hi"}, session=session) == "wrote hi"
    run_task(committing, None, session=session)  # its commit() only flushes

    assert session.scalars(select(Note.text).order_by(Note.id)).all() == [
        "hi",
        "committed by the handler?",
    ]
    assert notes(app_engine) == []  # nothing committed


def test_run_task_rolls_back_a_failing_handlers_writes_only(session: Session) -> None:
    session.add(Note(text="the test's own"))

    with pytest.raises(RuntimeError, match="boom 1"):
        run_task(write_then_fail, None, session=session)

    assert session.scalars(select(Note.text)).all() == ["the test's own"]


def test_run_task_without_a_session_says_to_pass_one() -> None:
    with pytest.raises(JobQueueError, match=r"uses ctx.session: pass run_task\(\.\.\., session"):
        run_task(write_note, {"text": "hi"})


# -- drain ------------------------------------------------------------------------------------


def test_drain_runs_due_jobs_and_those_they_enqueue(app_engine: sa.Engine) -> None:
    with Session(app_engine) as session, session.begin():
        queue.enqueue(session, write_note, {"text": "one"})
        queue.enqueue(session, chain, {"left": 2})
        queue.enqueue(session, describe, None)  # queue "emails", declared by the task
        queue.enqueue(session, describe_async, None)

    result = drain(queue, app_engine)

    assert (result.succeeded, result.failed, result.dead, result.cancelled) == (6, 0, 0, 0)
    assert len(result.job_ids) == 6
    assert sorted(notes(app_engine)) == ["link 0", "link 1", "link 2", "one"]
    assert drain(queue, app_engine) == DrainResult(0, 0, 0, 0)


def test_drain_leaves_retries_to_their_backoff_unless_told(app_engine: sa.Engine) -> None:
    with Session(app_engine) as session, session.begin():
        job_id = queue.enqueue(session, write_then_fail, None)

    first = drain(queue, app_engine)
    assert (first.succeeded, first.failed, first.dead) == (0, 1, 0)
    assert first.errors == {job_id: "builtins.RuntimeError: boom 1"}
    assert "errors={" in repr(first)

    rest = drain(queue, app_engine, with_retries=True)
    assert (rest.failed, rest.dead) == (0, 1)
    assert rest.errors == {job_id: "builtins.RuntimeError: boom 3"}
    assert notes(app_engine) == []  # every failed attempt's writes rolled back


def test_drain_runs_scheduled_jobs_only_when_told(app_engine: sa.Engine) -> None:
    with Session(app_engine) as session, session.begin():
        queue.enqueue(session, write_note, {"text": "later"}, run_at=timedelta(hours=1))

    assert drain(queue, app_engine).succeeded == 0
    assert drain(queue, app_engine, with_scheduled=True).succeeded == 1
    assert notes(app_engine) == ["later"]


def test_drain_stops_after_max_jobs(app_engine: sa.Engine) -> None:
    with Session(app_engine) as session, session.begin():
        queue.enqueue(session, chain, {"left": -1})  # enqueues its successor forever

    result = drain(queue, app_engine, max_jobs=3)

    assert result.succeeded == 3
    assert notes(app_engine) == ["link -1", "link -2", "link -3"]
    with Session(app_engine) as session:
        assert_enqueued(session, task=chain, payload={"left": -4})
    with pytest.raises(InvalidJobError, match="max_jobs"):
        drain(queue, app_engine, max_jobs=0)


def test_drain_serves_the_queues_asked_for_and_by_default_every_queue_with_jobs(
    app_engine: sa.Engine,
) -> None:
    with Session(app_engine) as session, session.begin():
        queue.enqueue(session, write_note, {"text": "elsewhere"}, queue="elsewhere")
        queue.enqueue(session, describe, None)

    assert drain(queue, app_engine, queues=["emails"]).succeeded == 1
    assert notes(app_engine) == []
    assert drain(queue, app_engine).succeeded == 1
    assert notes(app_engine) == ["elsewhere"]


def test_drain_takes_a_session_and_expires_its_objects(app_engine: sa.Engine) -> None:
    with Session(app_engine) as session:
        session.add(Note(text="mine"))
        queue.enqueue(session, write_note, {"text": "theirs"})
        session.commit()
        assert session.scalars(select(func.count()).select_from(Note)).one() == 1

        assert drain(queue, session).succeeded == 1
        assert session.scalars(select(func.count()).select_from(Note)).one() == 2


def test_drain_refuses_uncommitted_work(app_engine: sa.Engine) -> None:
    with Session(app_engine) as session:
        queue.enqueue(session, write_note, {"text": "not committed"})
        with pytest.raises(JobQueueError, match="uncommitted writes"):
            drain(queue, session)
        session.rollback()
        session.add(Note(text="not flushed"))
        with pytest.raises(JobQueueError, match="unflushed changes"):
            drain(queue, session)
    with app_engine.connect() as conn:
        conn.execute(select(1))  # a transaction that wrote nothing is fine
        assert drain(queue, conn).succeeded == 0
        queue.enqueue(conn, write_note, {"text": "not committed"})
        assert_enqueued(conn, task=write_note)
        with pytest.raises(JobQueueError, match="assert_enqueued"):
            drain(queue, conn)


def test_drain_gives_up_on_due_jobs_another_transaction_holds(app_engine: sa.Engine) -> None:
    with Session(app_engine) as session, session.begin():
        job_id = queue.enqueue(session, write_note, {"text": "locked"})
    with app_engine.connect() as conn:
        conn.execute(select(jobs_table.c.id).where(jobs_table.c.id == job_id).with_for_update())

        assert drain(queue, app_engine) == DrainResult(0, 0, 0, 0)  # and returns at once


def test_drain_enqueues_no_periodic_ticks(app_engine: sa.Engine) -> None:
    assert queue.schedules  # every_minute
    drain(queue, app_engine)
    with app_engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(periodic_table)).scalar() == 0
