"""Enqueue against the database where one transaction shows it all, each test rolled back.

Batches, limits, scheduling and task defaults as they are stored. What needs a commit, another
connection or NOTIFY (the outbox promise, wake-ups, refusals that leave the transaction usable)
is in tests/acceptance/test_enqueue.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from sa_jobqueue import (
    JobContext,
    JobQueue,
)
from tests.acceptance.test_enqueue import _after, _now, info, queue
from tests.helpers.jobs import handler, job

__all__ = ["queue"]  # the fixture: a queue with the tasks these tests enqueue


def test_enqueue_many_accepts_any_iterable(
    conn: sa.Connection, session: Session, queue: JobQueue
) -> None:
    with session.begin():
        ids = queue.enqueue_many(session, "plain", ({"n": n} for n in range(3)))
        mixed = queue.enqueue_many(session, "plain", [None, 1, "two", [3], {"four": 4.5}, True])
    assert [job(conn, i).payload for i in ids] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert [job(conn, i).payload for i in mixed] == [None, 1, "two", [3], {"four": 4.5}, True]


def test_values_at_the_limits_are_accepted(conn: sa.Connection, session: Session) -> None:
    queue = JobQueue(default_queue="q" * 64)
    longest = queue.task(name="t" * 200)(handler)
    with session.begin():
        high = queue.enqueue(session, longest, {"n": 1}, priority=32767, max_attempts=2**31 - 1)
        low = queue.enqueue(
            session,
            "t" * 200,
            {"n": 2},
            priority=-32768,
            queue="Z",
            lease=timedelta(microseconds=1),
        )
        zero = queue.enqueue(session, longest.name, None, run_at=timedelta(0))
    first, second, third = job(conn, high), job(conn, low), job(conn, zero)
    assert (first.queue, first.task, first.priority, first.max_attempts) == (
        "q" * 64,
        "t" * 200,
        32767,
        2**31 - 1,
    )
    assert (second.queue, second.priority, second.lease) == ("Z", -32768, timedelta(microseconds=1))
    assert third.payload is None
    assert third.visible_at == third.created_at


def test_run_at_datetime_is_stored_as_visible_at(
    conn: sa.Connection, session: Session, queue: JobQueue
) -> None:
    india = timezone(timedelta(hours=5, minutes=30))
    when = datetime(2031, 7, 4, 9, 30, 15, 123456, tzinfo=india)
    past = datetime(2001, 1, 1, tzinfo=UTC)
    with session.begin():
        single = queue.enqueue(session, "work_a", {"n": 1}, run_at=when)
        batch = queue.enqueue_many(session, "work_a", [{"n": 2}, {"n": 3}], run_at=when)
        overdue = queue.enqueue(session, "work_a", {"n": 4}, run_at=past)
    for job_id in [single, *batch]:
        stored = job(conn, job_id).visible_at
        assert stored == when
        assert stored.utcoffset() is not None
    assert job(conn, overdue).visible_at == past


def test_delay_in_days_is_an_exact_duration_across_dst(session: Session, queue: JobQueue) -> None:
    # A timedelta is an exact duration: 30 days are 720 hours even if a daylight-saving
    # change falls in between. Among twelve consecutive 30-day steps, at least one crosses
    # exactly one change of a zone with DST, whatever today's date is.
    delays = [timedelta(days=30 * k) for k in range(1, 13)]
    with session.begin():
        session.execute(sa.text("SET LOCAL TIME ZONE 'Europe/Berlin'"))
        now = _now(session)
        single = [
            queue.enqueue(session, "work_a", {"k": k}, run_at=d) for k, d in enumerate(delays)
        ]
        batches = [queue.enqueue_many(session, "work_a", [{"k": 0}], run_at=d)[0] for d in delays]
        assert [_after(info(queue, session, i).visible_at, now) for i in single] == delays
        assert [_after(info(queue, session, i).visible_at, now) for i in batches] == delays


def test_explicit_options_override_task_defaults(conn: sa.Connection, session: Session) -> None:
    queue = JobQueue()
    declared = queue.task(
        name="declared", queue="mail", priority=3, max_attempts=9, lease=timedelta(seconds=90)
    )(handler)
    options: dict[str, Any] = {
        "priority": -7,
        "max_attempts": 2,
        "lease": timedelta(minutes=3, microseconds=5),
        "queue": "urgent",
    }
    with session.begin():
        defaults = queue.enqueue(session, "declared", {"d": 1})
        defaults_many = queue.enqueue_many(session, declared, [{"d": 2}, {"d": 3}])
        overridden = queue.enqueue(session, "declared", {"o": 1}, **options)
        overridden_many = queue.enqueue_many(session, declared, [{"o": 2}, {"o": 3}], **options)
        partly = queue.enqueue(session, "declared", {"p": 1}, priority=0)
        as_seen = info(queue, session, overridden)

    for job_id in [defaults, *defaults_many]:
        row = job(conn, job_id)
        assert (row.task, row.queue, row.priority, row.max_attempts, row.lease) == (
            "declared",
            "mail",
            3,
            9,
            timedelta(seconds=90),
        )
    for job_id in [overridden, *overridden_many]:
        row = job(conn, job_id)
        assert (row.task, row.queue, row.priority, row.max_attempts, row.lease) == (
            "declared",
            "urgent",
            -7,
            2,
            timedelta(minutes=3, microseconds=5),
        )
    row = job(conn, partly)
    assert (row.queue, row.priority, row.max_attempts) == ("mail", 0, 9)  # 0 is not "unset"

    assert (as_seen.queue, as_seen.priority, as_seen.max_attempts) == ("urgent", -7, 2)
    assert (as_seen.status, as_seen.attempts) == ("queued", 0)
    assert as_seen.started_at is None
    assert as_seen.finished_at is None
    assert as_seen.last_error is None
    assert as_seen.payload == {"o": 1}


def test_queue_default_applies_to_tasks_without_a_queue(
    conn: sa.Connection, session: Session
) -> None:
    queue = JobQueue(default_queue="background")
    queue.task(name="undeclared")(handler)
    with session.begin():
        job_id = queue.enqueue(session, "undeclared", [1, 2])
    row = job(conn, job_id)
    assert (row.queue, row.priority, row.max_attempts, row.lease) == (
        "background",
        0,
        5,
        timedelta(seconds=30),
    )
    assert row.worker is None
    assert queue.counts(session) == {"background": {"queued": 1}}


def test_payload_round_trips(conn: sa.Connection, session: Session, queue: JobQueue) -> None:
    payload = {
        "text": "naïve ☃ \U0001f600 'quotes' \"double\" \\ back",
        "int": -(2**62),
        "float": 0.1,
        "bool": False,
        "none": None,
        "nested": {"list": [1, [2, {"three": 3}]], "empty": {}},
        "": "empty key",
    }
    with session.begin():
        job_id = queue.enqueue(session, "work_a", payload)
    assert job(conn, job_id).payload == payload


def test_task_object_can_be_passed_to_enqueue(conn: sa.Connection, session: Session) -> None:
    queue = JobQueue()

    @queue.task(queue="objects", priority=4, max_attempts=3)
    def by_object(ctx: JobContext, payload: Any) -> None:
        pass

    with session.begin():
        single = queue.enqueue(session, by_object, {"n": 1})
        many = queue.enqueue_many(session, by_object, [{"n": 2}])
        by_name = queue.enqueue(session, "by_object", {"n": 3})
    rows = [job(conn, i) for i in (single, *many, by_name)]
    assert {(r.task, r.queue, r.priority, r.max_attempts) for r in rows} == {
        ("by_object", "objects", 4, 3)
    }
    assert [r.payload for r in rows] == [{"n": 1}, {"n": 2}, {"n": 3}]
