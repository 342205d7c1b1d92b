"""sa_jobqueue.testing: the helpers users write their own tests with.

Each helper is checked both ways: it passes on what it should accept, and it fails, with a
message that says what was found, on what it should not. Each test runs in a transaction that
is rolled back; ``drain``, which needs committed jobs, is tested in tests/acceptance.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from unittest.mock import ANY

import pytest
import sqlalchemy as sa
from sqlalchemy import select
from sqlalchemy.orm import Session

from sa_jobqueue import InvalidJobError, JobContext, JobQueue
from sa_jobqueue.errors import PayloadError
from sa_jobqueue.testing import (
    assert_enqueued,
    enqueued_jobs,
    refute_enqueued,
    run_task,
)
from tests.apps.application import (
    Note,
    committing,
    describe,
    metadata,
    notes,
    queue,
    write_note,
    write_then_fail,
)

TABLES = metadata


# -- enqueued_jobs, assert_enqueued, refute_enqueued ------------------------------------------


def test_assert_enqueued_sees_an_uncommitted_enqueue_of_the_same_transaction(
    session: Session, tables: sa.Engine
) -> None:
    job_id = queue.enqueue(session, write_note, {"text": "hi"})

    job = assert_enqueued(session, task=write_note, payload={"text": "hi"})

    assert (job.id, job.task, job.queue, job.status) == (job_id, "write_note", "default", "queued")
    assert enqueued_jobs(session) == [job]
    refute_enqueued(tables)  # an Engine reads committed jobs only: there are none


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


@dataclass(frozen=True)
class Shipment:
    order_id: int
    express: bool = False


typed_queue = JobQueue()


@typed_queue.task
def ship(ctx: JobContext, payload: Shipment) -> None:
    """A task with a typed payload: a worker decodes its payload into a Shipment."""


def test_a_typed_payload_matches_as_a_worker_decodes_it_or_as_stored(session: Session) -> None:
    typed_queue.enqueue(session, ship, Shipment(order_id=7))

    # As the handler will get it, ANY inside it too, and as the JSON stored.
    assert_enqueued(session, task=ship, payload=Shipment(order_id=7))
    assert_enqueued(session, task=ship, payload=Shipment(order_id=ANY))
    assert_enqueued(session, task=ship, payload={"order_id": 7, "express": False})
    refute_enqueued(session, task=ship, payload=Shipment(order_id=7, express=True))
    assert len(enqueued_jobs(session, task=ship, payload=Shipment(order_id=7))) == 1
    # By name the task's type is unknown here: only the stored JSON can match.
    refute_enqueued(session, task="ship", payload=Shipment(order_id=7))


def test_enqueued_jobs_refuses_an_unknown_status(session: Session) -> None:
    with pytest.raises(InvalidJobError, match="unknown status 'done'"):
        enqueued_jobs(session, status="done")


# -- run_task ---------------------------------------------------------------------------------


def test_run_task_refuses_what_enqueue_would(session: Session) -> None:
    with pytest.raises(PayloadError):
        run_task(describe, {"ids": (1, 2)})
    with pytest.raises(InvalidJobError, match="attempt must be from 1 to max_attempts"):
        run_task(describe, None, attempt=4)


def test_run_task_writes_into_the_callers_transaction_without_committing(
    session: Session, tables: sa.Engine
) -> None:
    assert run_task(write_note, {"text": "hi"}, session=session) == "wrote hi"
    run_task(committing, None, session=session)  # its commit() only flushes

    assert session.scalars(select(Note.text).order_by(Note.id)).all() == [
        "hi",
        "committed by the handler?",
    ]
    assert notes(tables) == []  # nothing committed


def test_run_task_rolls_back_a_failing_handlers_writes_only(session: Session) -> None:
    session.add(Note(text="the test's own"))

    with pytest.raises(RuntimeError, match="boom 1"):
        run_task(write_then_fail, None, session=session)

    assert session.scalars(select(Note.text)).all() == ["the test's own"]
