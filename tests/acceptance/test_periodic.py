"""Periodic (cron) jobs: tick arithmetic across daylight saving time, and ``enqueue_due``.

The unit tests pin down which tick is "the latest" at any moment, in time zones with DST, by
comparing against forward iteration (what a cron daemon running all along would have fired).
The database tests call ``enqueue_due`` from several threads with engines of their own, with an
injected ``now`` to step through simulated ticks, and check that each tick is enqueued exactly
once, that missed ticks are not caught up, and that a new schedule starts with its next tick.
"""

from __future__ import annotations

import functools
import random
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sa_jobqueue import JobQueue
from sa_jobqueue.database import create_engine
from sa_jobqueue.models import jobs_table, periodic_table
from sa_jobqueue.periodic import enqueue_due, latest_tick
from tests.helpers.jobs import handler
from tests.helpers.periodic import YEARLY, last_tick, periodic_jobs, rewind, wait_registered
from tests.helpers.waiting import wait_for
from tests.unit.test_periodic import PARIS, at

j = jobs_table.c


# -- which tick is the latest, across DST ------------------------------------------------------


# -- declaring schedules -----------------------------------------------------------------------


# -- enqueue_due against the database ----------------------------------------------------------


def every_five_minutes(**task_options: Any) -> JobQueue:
    queue = JobQueue()
    queue.periodic("*/5 * * * *", timezone="Europe/Paris", payload={"n": 1})(
        queue.task(name="five", **task_options)(handler)
    )
    return queue


def ticks_of(engine: sa.Engine, task: str) -> list[str]:
    return [tick for _, tick in periodic_jobs(engine, task)]


def test_new_schedule_starts_with_its_next_tick(engine: sa.Engine) -> None:
    queue = every_five_minutes()
    first_seen = at("2026-06-01T10:02:30+02:00")
    assert enqueue_due(engine, queue, now=first_seen) == 0
    assert last_tick(engine, "five") == first_seen
    # The 10:00 tick came before the schedule was first seen: not run. 10:05 is its first.
    assert enqueue_due(engine, queue, now=at("2026-06-01T10:04:59+02:00")) == 0
    assert enqueue_due(engine, queue, now=at("2026-06-01T10:05:00+02:00")) == 1
    assert enqueue_due(engine, queue, now=at("2026-06-01T10:09:59+02:00")) == 0
    assert ticks_of(engine, "five") == ["2026-06-01T10:05:00+02:00"]
    assert last_tick(engine, "five") == at("2026-06-01T10:05:00+02:00")


def test_a_tick_at_the_moment_the_schedule_is_first_seen_is_not_run(engine: sa.Engine) -> None:
    queue = every_five_minutes()
    assert enqueue_due(engine, queue, now=at("2026-06-01T10:05:00+02:00")) == 0
    assert enqueue_due(engine, queue, now=at("2026-06-01T10:09:00+02:00")) == 0
    assert ticks_of(engine, "five") == []


def test_missed_ticks_enqueue_only_the_latest_once(engine: sa.Engine) -> None:
    queue = every_five_minutes()
    enqueue_due(engine, queue, now=at("2026-06-01T10:02:00+02:00"))
    # No worker ran for three hours: 36 ticks were missed; only the latest runs.
    later = at("2026-06-01T13:03:00+02:00")
    assert enqueue_due(engine, queue, now=later) == 1
    assert enqueue_due(engine, queue, now=later) == 0
    assert ticks_of(engine, "five") == ["2026-06-01T13:00:00+02:00"]


def test_the_job_carries_its_tick_and_the_tasks_options(engine: sa.Engine) -> None:
    queue = every_five_minutes(
        queue="cron", priority=-3, max_attempts=2, lease=timedelta(seconds=60)
    )
    enqueue_due(engine, queue, now=at("2026-06-01T10:02:00+02:00"))
    assert enqueue_due(engine, queue, now=at("2026-06-01T08:05:30+00:00")) == 1
    with Session(engine) as session:
        (job_id,) = session.execute(sa.select(j.id)).scalars()
        info = queue.get_job(session, job_id)
        now = session.execute(sa.select(sa.func.now())).scalar_one()
    assert info is not None
    assert info.payload == {"n": 1, "tick": "2026-06-01T10:05:00+02:00"}
    assert (info.task, info.queue, info.priority, info.max_attempts) == ("five", "cron", -3, 2)
    assert (info.status, info.attempts) == ("queued", 0)
    assert info.visible_at <= now  # due at once, by the database's clock


def test_the_default_now_is_the_database_clock(engine: sa.Engine) -> None:
    queue = every_five_minutes()
    with engine.begin() as conn:
        # now() is the transaction's start: equal to the microsecond only if it was used.
        db_now = conn.execute(sa.select(sa.func.now())).scalar_one()
        assert enqueue_due(conn, queue) == 0
        assert conn.execute(sa.select(periodic_table.c.last_tick)).scalar_one() == db_now
    rewind(engine, "five")
    assert enqueue_due(engine, queue) == 1
    with engine.connect() as conn:
        now = conn.execute(sa.select(sa.func.now())).scalar_one()
    ((_, tick),) = periodic_jobs(engine, "five")
    assert datetime.fromisoformat(tick) == latest_tick("*/5 * * * *", PARIS, now) or (
        # A five-minute boundary passed between the call and the check.
        datetime.fromisoformat(tick) == latest_tick("*/5 * * * *", PARIS, now - timedelta(2))
    )


def test_in_the_callers_transaction_the_tick_rolls_back_with_it(engine: sa.Engine) -> None:
    queue = every_five_minutes()
    enqueue_due(engine, queue, now=at("2026-06-01T10:02:00+02:00"))
    due = at("2026-06-01T10:06:00+02:00")
    with engine.connect() as conn:
        assert enqueue_due(conn, queue, now=due) == 1
        conn.rollback()
    assert ticks_of(engine, "five") == []
    assert last_tick(engine, "five") == at("2026-06-01T10:02:00+02:00")
    with engine.connect() as conn:
        assert enqueue_due(conn, queue, now=due) == 1
        conn.commit()
    assert ticks_of(engine, "five") == ["2026-06-01T10:05:00+02:00"]


def test_a_tick_whose_unique_key_is_held_is_skipped(engine: sa.Engine) -> None:
    queue = JobQueue()
    queue.periodic("*/5 * * * *")(queue.task(name="single", unique_key=lambda p: "single")(handler))
    enqueue_due(engine, queue, now=at("2026-06-01T10:02:00+00:00"))
    assert enqueue_due(engine, queue, now=at("2026-06-01T10:05:00+00:00")) == 1
    # The 10:05 job is still queued: the 10:10 tick is consumed without a job.
    assert enqueue_due(engine, queue, now=at("2026-06-01T10:10:00+00:00")) == 0
    assert last_tick(engine, "single") == at("2026-06-01T10:10:00+00:00")
    with engine.begin() as conn:
        conn.execute(sa.update(jobs_table).values(status="succeeded", finished_at=sa.func.now()))
    assert enqueue_due(engine, queue, now=at("2026-06-01T10:15:00+00:00")) == 1
    assert ticks_of(engine, "single") == ["2026-06-01T10:05:00+00:00", "2026-06-01T10:15:00+00:00"]


def test_a_queue_without_schedules_sends_nothing(engine: sa.Engine) -> None:
    sent: list[str] = []
    sa.event.listen(engine, "before_cursor_execute", lambda *args: sent.append(args[2]))
    assert enqueue_due(engine, JobQueue()) == 0
    assert sent == []
    with pytest.raises(ValueError, match="aware"):
        enqueue_due(engine, every_five_minutes(), now=datetime(2026, 6, 1, 10))


@pytest.fixture
def three_engines(database_url: URL) -> Iterator[list[sa.Engine]]:
    """Three engines, as three worker processes would have; one in autocommit like theirs."""
    engines = [
        create_engine(database_url, pool_size=1, isolation_level="AUTOCOMMIT"),
        create_engine(database_url, pool_size=1),
        create_engine(database_url, pool_size=1),
    ]
    yield engines
    for engine in engines:
        engine.dispose()


def test_three_processes_enqueue_each_tick_exactly_once(
    engine: sa.Engine, three_engines: list[sa.Engine]
) -> None:
    queue = every_five_minutes()
    # Through the autumn change in Paris: "*/5" ticks every five real minutes, both passes of
    # the repeated hour included, so each round has a tick of its own.
    base = at("2026-10-25T00:00:00+00:00")
    rounds = 30
    rng = random.Random(7)
    barrier = threading.Barrier(3)
    enqueued = [0, 0, 0]
    errors: list[BaseException] = []

    def process(index: int) -> None:
        try:
            for k in range(rounds + 1):
                # Each process sees the round's tick a little later or earlier than the others,
                # and now and then one still sees the previous round's tick.
                offset = timedelta(seconds=rng.randrange(0, 300))
                if k and rng.random() < 0.2:
                    offset -= timedelta(minutes=5)
                barrier.wait(timeout=30)
                enqueued[index] += enqueue_due(
                    three_engines[index], queue, now=base + timedelta(minutes=5 * k) + offset
                )
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    attempts: list[str] = []  # compare-and-set statements sent, won or lost

    def count_attempt(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "WITH moved AS" in statement:
            attempts.append(statement)

    for each in three_engines:
        sa.event.listen(each, "before_cursor_execute", count_attempt)
    threads = [threading.Thread(target=process, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    ticks = ticks_of(engine, "five")
    # The processes really raced for the ticks: most rounds, two or three tried.
    assert len(attempts) > 1.5 * len(ticks)
    assert len(ticks) == len(set(ticks)), "a tick was enqueued twice"
    assert sum(enqueued) == len(ticks)
    # Round 0 registered the schedule; every later round's tick ran once, unless all three
    # processes happened to see only the previous tick in that round (then it runs late, in
    # the next round, or is skipped as a missed tick).
    expected = {
        (base + timedelta(minutes=5 * k)).astimezone(PARIS).isoformat()
        for k in range(1, rounds + 1)
    }
    assert set(ticks) <= expected
    assert len(ticks) >= rounds - 3
    assert sorted(ticks, key=datetime.fromisoformat) == ticks  # enqueued in tick order
    assert "2026-10-25T02:30:00+02:00" in ticks or "2026-10-25T02:30:00+01:00" in ticks


def test_concurrent_loops_with_the_database_clock_enqueue_once_per_rewind(
    engine: sa.Engine, three_engines: list[sa.Engine]
) -> None:
    """Three loops calling enqueue_due as workers will (database clock), driven by the helper
    that the worker-process test uses."""
    queue = JobQueue()
    queue.periodic(YEARLY, name="yearly")(queue.task(name="yearly_task")(handler))
    stop = threading.Event()
    calls = [0, 0, 0]
    errors: list[BaseException] = []

    def loop(index: int) -> None:
        try:
            while not stop.is_set():
                enqueue_due(three_engines[index], queue)
                calls[index] += 1
        except BaseException as exc:
            errors.append(exc)

    def jobs_or_errors(expected: int) -> bool:
        return bool(errors) or len(periodic_jobs(engine, "yearly_task")) >= expected

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    try:
        wait_registered(engine, "yearly")
        for rounds in range(1, 6):
            rewind(engine, "yearly")
            wait_for(functools.partial(jobs_or_errors, rounds))
            assert not errors, errors
        # Let every loop go round a few more times after the last rewind.
        seen = list(calls)
        wait_for(lambda: all(c >= s + 5 for c, s in zip(calls, seen, strict=True)) or errors)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert not errors, errors
    ticks = ticks_of(engine, "yearly_task")
    assert len(ticks) == 5
    assert len(set(ticks)) == 1  # the same (latest) tick, made due again five times
