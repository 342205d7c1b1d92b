"""Unique modes (replace, debounce) and unique periods, in one transaction.

Everything here runs in the test's one transaction, so ``now()`` is the same instant in every
statement and the due times can be checked exactly. What needs other transactions (a claim
racing a replace, many enqueuers at once, the wake-ups) is in tests/acceptance.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sa_jobqueue import InvalidJobError, JobQueue
from sa_jobqueue.errors import TaskDefinitionError
from tests.acceptance.test_unique_jobs import finish, j, live, set_running
from tests.helpers.jobs import handler


@pytest.fixture
def queue() -> JobQueue:
    queue = JobQueue()
    queue.task(name="skip", queue="a")(handler)
    queue.task(name="replace", queue="a", unique_mode="replace")(handler)
    queue.task(name="debounce", queue="a", unique_mode="debounce", debounce=timedelta(seconds=10))(
        handler
    )
    queue.task(name="hourly", queue="a", unique_period=timedelta(hours=1))(handler)
    queue.task(
        name="hourly_replace", queue="a", unique_mode="replace", unique_period=timedelta(hours=1)
    )(handler)
    return queue


def now(conn: sa.Connection) -> datetime:
    return conn.execute(select(func.now())).scalar_one()


def row(conn: sa.Connection, job_id: int) -> Any:
    return conn.execute(
        select(j.payload, j.priority, j.visible_at, j.status, j.unique_window).where(j.id == job_id)
    ).one()


# -- replace ------------------------------------------------------------------------------------


def test_replace_gives_a_queued_holder_the_new_payload_priority_and_due_time(
    conn: sa.Connection, session: Session, queue: JobQueue
) -> None:
    first = queue.enqueue(session, "replace", {"n": 1}, unique_key="k", run_at=timedelta(hours=1))
    second = queue.enqueue(session, "replace", {"n": 2}, unique_key="k", priority=-3)
    assert (first.created, first.updated) == (True, False)
    assert (second, second.created, second.updated) == (first, False, True)
    got = row(conn, first)
    assert (got.payload, got.priority, got.visible_at) == ({"n": 2}, -3, now(conn))
    # A later due time is taken as it is: replace means "the last enqueue wins".
    third = queue.enqueue(session, "replace", {"n": 3}, unique_key="k", run_at=timedelta(hours=2))
    assert (third, third.updated) == (first, True)
    assert row(conn, first).visible_at == now(conn) + timedelta(hours=2)
    assert live(conn, "replace", "k") == [first]


def test_replace_never_touches_a_running_holder(
    conn: sa.Connection, session: Session, queue: JobQueue
) -> None:
    first = queue.enqueue(session, "replace", {"n": 1}, unique_key="k")
    set_running(conn, first)
    before = row(conn, first)
    again = queue.enqueue(session, "replace", {"n": 2}, unique_key="k", priority=5)
    assert (again, again.created, again.updated) == (first, False, False)
    assert row(conn, first) == before
    assert live(conn, "replace", "k") == [first]


def test_replace_overrides_per_enqueue_and_skip_stays_the_default(
    conn: sa.Connection, session: Session, queue: JobQueue
) -> None:
    first = queue.enqueue(session, "skip", {"n": 1}, unique_key="k")
    skipped = queue.enqueue(session, "skip", {"n": 2}, unique_key="k")
    assert (skipped.created, skipped.updated) == (False, False)
    assert row(conn, first).payload == {"n": 1}
    replaced = queue.enqueue(session, "skip", {"n": 3}, unique_key="k", unique_mode="replace")
    assert (replaced, replaced.updated) == (first, True)
    assert row(conn, first).payload == {"n": 3}
    kept = queue.enqueue(session, "replace", {"n": 4}, unique_key="r")
    not_replaced = queue.enqueue(session, "replace", {"n": 5}, unique_key="r", unique_mode="skip")
    assert (not_replaced, not_replaced.updated) == (kept, False)
    assert row(conn, kept).payload == {"n": 4}


def test_a_finished_holder_frees_the_key_for_replace(
    conn: sa.Connection, session: Session, queue: JobQueue
) -> None:
    first = queue.enqueue(session, "replace", {"n": 1}, unique_key="k")
    finish(conn, first)
    second = queue.enqueue(session, "replace", {"n": 2}, unique_key="k")
    assert second.created
    assert second != first
    assert row(conn, first).payload == {"n": 1}


# -- debounce -----------------------------------------------------------------------------------


def test_debounce_moves_the_due_time_later_only_and_takes_the_last_payload(
    conn: sa.Connection, session: Session, queue: JobQueue
) -> None:
    first = queue.enqueue(session, "debounce", {"n": 1}, unique_key="k")
    assert row(conn, first).visible_at == now(conn) + timedelta(seconds=10)  # the task's delay
    shorter = queue.enqueue(session, "debounce", {"n": 2}, unique_key="k", run_at=timedelta(0))
    assert (shorter, shorter.created, shorter.updated) == (first, False, True)
    got = row(conn, first)
    assert (got.payload, got.visible_at) == ({"n": 2}, now(conn) + timedelta(seconds=10))
    longer = queue.enqueue(session, "debounce", {"n": 3}, unique_key="k", run_at=timedelta(60))
    assert longer.updated
    got = row(conn, first)
    assert (got.payload, got.visible_at) == ({"n": 3}, now(conn) + timedelta(days=60))
    at = datetime(2999, 1, 1, tzinfo=UTC)
    queue.enqueue(session, "debounce", {"n": 4}, unique_key="k", run_at=at)
    assert row(conn, first).visible_at == at


def test_debounce_on_a_running_holder_skips(
    conn: sa.Connection, session: Session, queue: JobQueue
) -> None:
    first = queue.enqueue(session, "debounce", {"n": 1}, unique_key="k")
    set_running(conn, first)
    before = row(conn, first)
    again = queue.enqueue(session, "debounce", {"n": 2}, unique_key="k")
    assert (again, again.created, again.updated) == (first, False, False)
    assert row(conn, first) == before


# -- unique periods -----------------------------------------------------------------------------


def window_start(conn: sa.Connection) -> datetime:
    return conn.execute(select(func.date_trunc("hour", func.now()))).scalar_one()


@pytest.mark.parametrize("outcome", ["succeeded", "dead", "cancelled"])
def test_a_period_holds_the_key_after_the_job_finished(
    conn: sa.Connection, session: Session, queue: JobQueue, outcome: str
) -> None:
    first = queue.enqueue(session, "hourly", {"n": 1}, unique_key="k")
    assert row(conn, first).unique_window == window_start(conn)
    assert not queue.enqueue(session, "hourly", {"n": 2}, unique_key="k").created
    finish(conn, first, outcome)
    again = queue.enqueue(session, "hourly", {"n": 3}, unique_key="k")
    assert (again, again.created, again.updated) == (first, False, False)
    assert live(conn, "hourly", "k") == []
    # Another key, or the same key in another task, is not held.
    assert queue.enqueue(session, "hourly", {"n": 4}, unique_key="other").created
    assert queue.enqueue(session, "skip", {"n": 5}, unique_key="k").created


def test_the_next_window_frees_the_key(
    conn: sa.Connection, session: Session, queue: JobQueue
) -> None:
    first = queue.enqueue(session, "hourly", {"n": 1}, unique_key="k")
    finish(conn, first)
    # As if it had been enqueued an hour earlier: its window has passed.
    conn.execute(
        sa.update(j.id.table)
        .where(j.id == first)
        .values(unique_window=j.unique_window - timedelta(hours=1))
    )
    second = queue.enqueue(session, "hourly", {"n": 2}, unique_key="k")
    assert second.created
    assert second != first


def test_a_live_job_from_an_earlier_window_still_holds_its_key(
    conn: sa.Connection, session: Session, queue: JobQueue
) -> None:
    first = queue.enqueue(session, "hourly", {"n": 1}, unique_key="k")
    conn.execute(
        sa.update(j.id.table)
        .where(j.id == first)
        .values(unique_window=j.unique_window - timedelta(hours=1))
    )
    again = queue.enqueue(session, "hourly", {"n": 2}, unique_key="k")
    assert (again, again.created) == (first, False)


def test_a_period_with_replace_updates_a_queued_holder_and_skips_a_finished_one(
    conn: sa.Connection, session: Session, queue: JobQueue
) -> None:
    first = queue.enqueue(session, "hourly_replace", {"n": 1}, unique_key="k")
    replaced = queue.enqueue(session, "hourly_replace", {"n": 2}, unique_key="k")
    assert (replaced, replaced.updated) == (first, True)
    finish(conn, first)
    skipped = queue.enqueue(session, "hourly_replace", {"n": 3}, unique_key="k")
    assert (skipped, skipped.created, skipped.updated) == (first, False, False)
    assert row(conn, first).payload == {"n": 2}


def test_a_period_given_per_enqueue(conn: sa.Connection, session: Session, queue: JobQueue) -> None:
    first = queue.enqueue(session, "skip", {}, unique_key="k", unique_period=timedelta(days=1))
    assert (
        row(conn, first).unique_window
        == conn.execute(select(func.date_trunc("day", func.now(), "UTC"))).scalar_one()
    )
    finish(conn, first)
    held = queue.enqueue(session, "skip", {}, unique_key="k", unique_period=timedelta(days=1))
    assert (held, held.created) == (first, False)
    # Without the period the finished job holds nothing.
    assert queue.enqueue(session, "skip", {}, unique_key="k").created


# -- batches ------------------------------------------------------------------------------------


def test_a_replace_batch_keeps_the_last_payload_of_each_key(
    conn: sa.Connection, session: Session, queue: JobQueue
) -> None:
    queued = queue.enqueue(session, "replace", {"held": "queued"}, unique_key="q")
    running = queue.enqueue(session, "replace", {"held": "running"}, unique_key="r")
    set_running(conn, running)
    keys = ["a", None, "q", "a", "r", "q", "a", None]
    jobs = queue.enqueue_many(
        session, "replace", [{"i": i} for i in range(len(keys))], unique_keys=keys, priority=2
    )
    flags = [(job.created, job.updated) for job in jobs]
    assert flags == [
        (True, False),  # a: added ...
        (True, False),
        (False, True),  # q: the queued holder replaced
        (False, True),  # a: ... and replaced by a later payload of the batch
        (False, False),  # r: running, left alone
        (False, True),
        (False, True),
        (True, False),
    ]
    assert jobs[0] == jobs[3] == jobs[6]
    assert jobs[2] == jobs[5] == queued
    assert jobs[4] == running
    assert (row(conn, jobs[0]).payload, row(conn, queued).payload) == ({"i": 6}, {"i": 5})
    assert (row(conn, queued).priority, row(conn, running).payload) == (2, {"held": "running"})
    assert [row(conn, jobs[i]).payload for i in (1, 7)] == [{"i": 1}, {"i": 7}]


def test_a_debounce_batch_and_a_period_batch(
    conn: sa.Connection, session: Session, queue: JobQueue
) -> None:
    held = queue.enqueue(session, "debounce", {"n": 0}, unique_key="d", run_at=timedelta(days=1))
    jobs = queue.enqueue_many(session, "debounce", [{"n": 1}, {"n": 2}], unique_keys=["d", "e"])
    assert [(job.created, job.updated) for job in jobs] == [(False, True), (True, False)]
    assert row(conn, held).visible_at == now(conn) + timedelta(days=1)  # not earlier
    assert row(conn, jobs[1]).visible_at == now(conn) + timedelta(seconds=10)
    first = queue.enqueue_many(session, "hourly", [{}, {}, {}], unique_keys=["x", None, "x"])
    finish(conn, first[0])
    again = queue.enqueue_many(session, "hourly", [{}, {}], unique_keys=["x", "y"])
    assert [(job, job.created) for job in again] == [(first[0], False), (again[1], True)]
    assert row(conn, first[1]).unique_window is None  # no key, no window
    assert row(conn, again[1]).unique_window == window_start(conn)


# -- refused ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"unique_mode": "upsert"}, "unique_mode must be one of skip, replace, debounce"),
        ({"unique_period": timedelta(seconds=1.5)}, "whole seconds"),
        ({"unique_period": timedelta(0)}, "whole seconds"),
        ({"unique_period": 3600}, "whole seconds"),
        ({"debounce": timedelta(seconds=5)}, "delay of unique_mode='debounce'"),
        ({"unique_mode": "debounce", "debounce": timedelta(seconds=-1)}, "delay"),
    ],
)
def test_bad_task_options_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(TaskDefinitionError, match=message):
        JobQueue().task(name="bad", **options)(handler)


def test_bad_enqueue_options_are_refused_before_any_sql(
    conn: sa.Connection, session: Session, queue: JobQueue
) -> None:
    with pytest.raises(InvalidJobError, match="unique_mode"):
        queue.enqueue(session, "skip", {}, unique_key="k", unique_mode="merge")  # type: ignore[arg-type]
    with pytest.raises(InvalidJobError, match="unique_period"):
        queue.enqueue_many(session, "skip", [{}], unique_period=timedelta(milliseconds=1))
    assert conn.execute(select(func.count()).select_from(j.id.table)).scalar_one() == 0


# -- tracing ------------------------------------------------------------------------------------


def test_a_replaced_job_takes_the_replacing_enqueues_trace_context(
    conn: sa.Connection, session: Session
) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    traced = JobQueue(tracing=True)
    traced.task(name="replace", unique_mode="replace")(handler)
    tracer = TracerProvider().get_tracer("tests")

    def trace_of(job_id: int) -> str:
        stored = conn.execute(select(j.trace_context).where(j.id == job_id)).scalar_one()
        return str(stored["traceparent"])

    with tracer.start_as_current_span("first request") as first_span:
        first = traced.enqueue(session, "replace", {"n": 1}, unique_key="k")
    with tracer.start_as_current_span("second request") as second_span:
        traced.enqueue_many(session, "replace", [{"n": 2}], unique_keys=["k"])
    first_trace = format(first_span.get_span_context().trace_id, "032x")
    second_trace = format(second_span.get_span_context().trace_id, "032x")
    assert first_trace != second_trace
    assert second_trace in trace_of(first)
    with tracer.start_as_current_span("third request") as third_span:
        traced.enqueue(session, "replace", {"n": 3}, unique_key="k")
    assert format(third_span.get_span_context().trace_id, "032x") in trace_of(first)
    # Outside any span nothing is recorded, and the job keeps the context it has.
    traced.enqueue(session, "replace", {"n": 4}, unique_key="k")
    assert format(third_span.get_span_context().trace_id, "032x") in trace_of(first)
    assert row(conn, first).payload == {"n": 4}


def test_an_updated_enqueued_pickles_with_its_flags(session: Session, queue: JobQueue) -> None:
    import pickle

    queue.enqueue(session, "replace", {"n": 1}, unique_key="k")
    updated = queue.enqueue(session, "replace", {"n": 2}, unique_key="k")
    copied = pickle.loads(pickle.dumps(updated))
    assert (copied, copied.created, copied.updated) == (updated, False, True)
