"""sa_jobqueue.testing's drain, against committed jobs in a database of the test's own."""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sa_jobqueue import InvalidJobError, JobQueueError
from sa_jobqueue.models import jobs_table, periodic_table
from sa_jobqueue.testing import DrainResult, assert_enqueued, drain
from tests.apps.application import (
    Note,
    chain,
    describe,
    describe_async,
    metadata,
    notes,
    queue,
    write_note,
    write_then_fail,
)

TABLES = metadata


# -- drain ------------------------------------------------------------------------------------


def test_drain_runs_due_jobs_and_those_they_enqueue(tables: sa.Engine) -> None:
    with Session(tables) as session, session.begin():
        queue.enqueue(session, write_note, {"text": "one"})
        queue.enqueue(session, chain, {"left": 2})
        queue.enqueue(session, describe, None)  # queue "emails", declared by the task
        queue.enqueue(session, describe_async, None)

    result = drain(queue, tables)

    assert (result.succeeded, result.failed, result.dead, result.cancelled) == (6, 0, 0, 0)
    assert len(result.job_ids) == 6
    assert sorted(notes(tables)) == ["link 0", "link 1", "link 2", "one"]
    assert drain(queue, tables) == DrainResult(0, 0, 0, 0)


def test_drain_leaves_retries_to_their_backoff_unless_told(tables: sa.Engine) -> None:
    with Session(tables) as session, session.begin():
        job_id = queue.enqueue(session, write_then_fail, None)

    first = drain(queue, tables)
    assert (first.succeeded, first.failed, first.dead) == (0, 1, 0)
    assert first.errors == {job_id: "builtins.RuntimeError: boom 1"}
    assert "errors={" in repr(first)

    rest = drain(queue, tables, with_retries=True)
    assert (rest.failed, rest.dead) == (0, 1)
    assert rest.errors == {job_id: "builtins.RuntimeError: boom 3"}
    assert notes(tables) == []  # every failed attempt's writes rolled back


def test_drain_runs_scheduled_jobs_only_when_told(tables: sa.Engine) -> None:
    with Session(tables) as session, session.begin():
        queue.enqueue(session, write_note, {"text": "later"}, run_at=timedelta(hours=1))

    assert drain(queue, tables).succeeded == 0
    assert drain(queue, tables, with_scheduled=True).succeeded == 1
    assert notes(tables) == ["later"]


def test_drain_stops_after_max_jobs(tables: sa.Engine) -> None:
    with Session(tables) as session, session.begin():
        queue.enqueue(session, chain, {"left": -1})  # enqueues its successor forever

    result = drain(queue, tables, max_jobs=3)

    assert result.succeeded == 3
    assert notes(tables) == ["link -1", "link -2", "link -3"]
    with Session(tables) as session:
        assert_enqueued(session, task=chain, payload={"left": -4})
    with pytest.raises(InvalidJobError, match="max_jobs"):
        drain(queue, tables, max_jobs=0)


def test_drain_serves_the_queues_asked_for_and_by_default_every_queue_with_jobs(
    tables: sa.Engine,
) -> None:
    with Session(tables) as session, session.begin():
        queue.enqueue(session, write_note, {"text": "elsewhere"}, queue="elsewhere")
        queue.enqueue(session, describe, None)

    assert drain(queue, tables, queues=["emails"]).succeeded == 1
    assert notes(tables) == []
    assert drain(queue, tables).succeeded == 1
    assert notes(tables) == ["elsewhere"]


def test_drain_takes_a_session_and_expires_its_objects(tables: sa.Engine) -> None:
    with Session(tables) as session:
        session.add(Note(text="mine"))
        queue.enqueue(session, write_note, {"text": "theirs"})
        session.commit()
        assert session.scalars(select(func.count()).select_from(Note)).one() == 1

        assert drain(queue, session).succeeded == 1
        assert session.scalars(select(func.count()).select_from(Note)).one() == 2


def test_drain_refuses_uncommitted_work(tables: sa.Engine) -> None:
    with Session(tables) as session:
        queue.enqueue(session, write_note, {"text": "not committed"})
        with pytest.raises(JobQueueError, match="uncommitted writes"):
            drain(queue, session)
        session.rollback()
        session.add(Note(text="not flushed"))
        with pytest.raises(JobQueueError, match="unflushed changes"):
            drain(queue, session)
    with tables.connect() as conn:
        conn.execute(select(1))  # a transaction that wrote nothing is fine
        assert drain(queue, conn).succeeded == 0
        queue.enqueue(conn, write_note, {"text": "not committed"})
        assert_enqueued(conn, task=write_note)
        with pytest.raises(JobQueueError, match="assert_enqueued"):
            drain(queue, conn)


def test_drain_gives_up_on_due_jobs_another_transaction_holds(tables: sa.Engine) -> None:
    with Session(tables) as session, session.begin():
        job_id = queue.enqueue(session, write_note, {"text": "locked"})
    with tables.connect() as conn:
        conn.execute(select(jobs_table.c.id).where(jobs_table.c.id == job_id).with_for_update())

        assert drain(queue, tables) == DrainResult(0, 0, 0, 0)  # and returns at once


def test_drain_enqueues_no_periodic_ticks(tables: sa.Engine) -> None:
    assert queue.schedules  # every_minute
    drain(queue, tables)
    with tables.connect() as conn:
        assert conn.execute(select(func.count()).select_from(periodic_table)).scalar() == 0
