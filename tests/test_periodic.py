"""Periodic (cron) jobs: tick arithmetic across daylight saving time, and ``enqueue_due``.

The unit tests pin down which tick is "the latest" at any moment, in time zones with DST, by
comparing against forward iteration (what a cron daemon running all along would have fired).
The database tests call ``enqueue_due`` from several threads with engines of their own, with an
injected ``now`` to step through simulated ticks, and check that each tick is enqueued exactly
once, that missed ticks are not caught up, and that a new schedule starts with its next tick.
"""

from __future__ import annotations

import bisect
import functools
import random
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import sqlalchemy as sa
from cronsim import CronSim
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sa_jobqueue import JobContext, JobQueue, TaskDefinitionError
from sa_jobqueue.database import create_engine
from sa_jobqueue.models import jobs_table, periodic_table
from sa_jobqueue.periodic import Schedule, enqueue_due, latest_tick, next_tick
from tests.periodic_support import YEARLY, last_tick, periodic_jobs, rewind, wait_registered
from tests.support import wait_for

PARIS = ZoneInfo("Europe/Paris")
j = jobs_table.c


def handler(ctx: JobContext, payload: Any) -> None:
    """Never run here: these tests look at the jobs that were enqueued."""


def at(text: str) -> datetime:
    """An aware datetime from ISO 8601 text with an offset."""
    moment = datetime.fromisoformat(text)
    assert moment.utcoffset() is not None
    return moment


# -- which tick is the latest, across DST ------------------------------------------------------


@pytest.mark.parametrize(
    ("cron", "now", "expected"),
    [
        # Spring forward in Paris (2026-03-29, 02:00 -> 03:00): 02:30 does not exist that day,
        # and the daily 02:30 job runs at the end of the gap, once.
        ("30 2 * * *", "2026-03-29T01:59:00+01:00", "2026-03-28T02:30:00+01:00"),
        ("30 2 * * *", "2026-03-29T03:00:00+02:00", "2026-03-29T03:00:00+02:00"),
        ("30 2 * * *", "2026-03-30T02:29:00+02:00", "2026-03-29T03:00:00+02:00"),
        ("30 2 * * *", "2026-03-30T02:30:00+02:00", "2026-03-30T02:30:00+02:00"),
        # Fall back (2026-10-25, 03:00 -> 02:00): 02:30 happens twice; the job runs at the
        # first, and the second pass does not run it again, seen from before or after 02:30.
        ("30 2 * * *", "2026-10-25T02:30:00+02:00", "2026-10-25T02:30:00+02:00"),
        ("30 2 * * *", "2026-10-25T02:10:00+01:00", "2026-10-25T02:30:00+02:00"),
        ("30 2 * * *", "2026-10-25T02:45:00+01:00", "2026-10-25T02:30:00+02:00"),
        # An expression that starts with "*" follows elapsed time: both passes run.
        ("*/30 * * * *", "2026-10-25T02:45:00+01:00", "2026-10-25T02:30:00+01:00"),
        ("*/30 * * * *", "2026-10-25T02:15:00+01:00", "2026-10-25T02:00:00+01:00"),
        ("*/30 * * * *", "2026-10-25T02:59:59+02:00", "2026-10-25T02:30:00+02:00"),
        ("0 * * * *", "2026-10-25T02:00:00+01:00", "2026-10-25T02:00:00+01:00"),
        ("*/30 * * * *", "2026-03-29T03:29:00+02:00", "2026-03-29T03:00:00+02:00"),
        # A tick exactly at now counts; microseconds do not matter.
        ("*/5 * * * *", "2026-06-01T12:05:00+02:00", "2026-06-01T12:05:00+02:00"),
        ("*/5 * * * *", "2026-06-01T12:04:59.999999+02:00", "2026-06-01T12:00:00+02:00"),
    ],
)
def test_latest_tick_in_paris(cron: str, now: str, expected: str) -> None:
    tick = latest_tick(cron, PARIS, at(now))
    assert tick is not None
    assert tick.isoformat() == expected
    assert tick.timestamp() == at(expected).timestamp()


def _forward(cron: str, zone: ZoneInfo, start: datetime, end: datetime) -> list[datetime]:
    ticks = []
    for tick in CronSim(cron, start.astimezone(zone)):
        if tick > end:
            return ticks
        ticks.append(tick)
    raise AssertionError("unreachable: cron iteration is endless")


TRANSITIONS = [
    pytest.param("Europe/Paris", "2026-03-29T01:00:00+00:00", id="paris-spring"),
    pytest.param("Europe/Paris", "2026-10-25T01:00:00+00:00", id="paris-autumn"),
    pytest.param("America/New_York", "2026-03-08T07:00:00+00:00", id="new-york-spring"),
    pytest.param("America/New_York", "2026-11-01T06:00:00+00:00", id="new-york-autumn"),
    # Lord Howe Island moves its clocks by half an hour. (Its autumn change is tested on its
    # own below: there cronsim's forward iteration skips ticks, so it cannot be the reference.)
    pytest.param("Australia/Lord_Howe", "2026-10-03T15:30:00+00:00", id="lord-howe-spring"),
]
EXPRESSIONS = [
    "30 2 * * *",
    "0 2 * * *",
    "0 3 * * *",
    "45 1 * * *",
    "15 1-3 * * *",
    "*/15 * * * *",
    "0 * * * *",
    "*/7 2 * * *",
]


@pytest.mark.parametrize(("timezone", "transition"), TRANSITIONS)
def test_latest_tick_agrees_with_forward_iteration_around_dst(
    timezone: str, transition: str
) -> None:
    zone = ZoneInfo(timezone)
    change = at(transition)
    start, end = change - timedelta(hours=30), change + timedelta(hours=30)
    for cron in EXPRESSIONS:
        ticks = _forward(cron, zone, start, end)
        instants = [t.timestamp() for t in ticks]
        assert instants == sorted(instants), f"{cron}: ticks go backwards"
        assert len(set(instants)) == len(instants), f"{cron}: a tick repeats"
        now = change - timedelta(hours=4)
        while now < change + timedelta(hours=4):
            expected = ticks[bisect.bisect_right(instants, now.timestamp()) - 1]
            got = latest_tick(cron, zone, now)
            # By instant: datetimes of one zone compare by wall-clock time, blind to fold.
            assert got is not None
            assert (got.timestamp(), got.isoformat()) == (
                expected.timestamp(),
                expected.isoformat(),
            ), f"{cron} at {now.astimezone(zone).isoformat()}"
            now += timedelta(minutes=2)


def test_latest_tick_after_a_half_hour_fall_back() -> None:
    # Lord Howe, 2026-04-05: at 02:00 +11:00 the clocks go back to 01:30 +10:30, so 02:00 to
    # 02:29 happen once, at +10:30, half an hour after the change. Forward iteration in cronsim
    # 2.8 jumps from 02:00 to 02:35 there; walking backwards finds every tick.
    zone = ZoneInfo("Australia/Lord_Howe")
    for now, expected in [
        ("2026-04-05T01:45:00+10:30", "2026-04-04T02:56:00+11:00"),
        ("2026-04-05T02:00:00+10:30", "2026-04-05T02:00:00+10:30"),
        ("2026-04-05T02:10:00+10:30", "2026-04-05T02:07:00+10:30"),
        ("2026-04-05T02:30:00+10:30", "2026-04-05T02:28:00+10:30"),
        ("2026-04-05T02:40:00+10:30", "2026-04-05T02:35:00+10:30"),
    ]:
        tick = latest_tick("*/7 2 * * *", zone, at(now))
        assert tick is not None
        assert tick.isoformat() == expected


def test_next_tick_and_schedule_latest_tick() -> None:
    assert next_tick("0 3 * * *", PARIS, at("2026-10-24T03:00:00+02:00")) == at(
        "2026-10-25T03:00:00+01:00"
    )
    queue = JobQueue()
    queue.periodic("*/10 * * * *", timezone="Europe/Paris")(handler)
    schedule = queue.schedules["handler"]
    base = at("2026-06-01T12:00:00+02:00")
    for seconds in [0, 1, 599, 600, 1199, 3, 1200, 0]:  # in order and out of order
        now = base + timedelta(seconds=seconds)
        assert schedule.latest_tick(now) == latest_tick("*/10 * * * *", PARIS, now)


# -- declaring schedules -----------------------------------------------------------------------


def test_periodic_stacks_over_a_task_and_registers_a_bare_handler() -> None:
    queue = JobQueue()

    @queue.periodic("0 3 * * *", timezone="Europe/Paris", payload={"report": "daily"})
    @queue.periodic("0 12 * * MON", name="weekly_report", payload={"report": "weekly"})
    @queue.task(queue="reports", priority=3)
    def report(ctx: JobContext, payload: Any) -> None:
        pass

    @queue.periodic("*/5 * * * *")
    def bare(ctx: JobContext, payload: Any) -> None:
        pass

    assert queue.get_task("report") is report
    assert set(queue.tasks) == {"report", "bare"}
    assert queue.get_task("bare").queue == "default"
    schedules = queue.schedules
    assert set(schedules) == {"report", "weekly_report", "bare"}
    assert schedules["report"].task is report
    assert (schedules["report"].cron, schedules["report"].timezone) == ("0 3 * * *", PARIS.key)
    assert schedules["weekly_report"].payload == {"report": "weekly"}
    assert schedules["weekly_report"].timezone == "UTC"
    assert schedules["bare"].payload == {}
    tick = at("2026-03-29T03:00:00+02:00")
    assert schedules["report"].job_payload(tick) == {
        "report": "daily",
        "tick": "2026-03-29T03:00:00+02:00",
    }
    # The tick is written in the schedule's zone, whatever zone it was given in.
    assert schedules["weekly_report"].job_payload(tick)["tick"] == "2026-03-29T01:00:00+00:00"


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"cron": "* * * *"}, id="four-fields"),
        pytest.param({"cron": "0 * * * * *"}, id="six-fields"),
        pytest.param({"cron": "61 * * * *"}, id="bad-minute"),
        pytest.param({"cron": "0 0 30 2 *"}, id="never"),
        pytest.param({"cron": "@daily"}, id="alias"),
        pytest.param({"timezone": "Mars/Olympus"}, id="unknown-zone"),
        pytest.param({"timezone": "../etc/passwd"}, id="bad-zone"),
        pytest.param({"payload": {"tick": 1}}, id="payload-with-tick"),
        pytest.param({"payload": [1, 2]}, id="payload-not-a-dict"),
        pytest.param({"payload": {"when": datetime(2030, 1, 1, tzinfo=UTC)}}, id="not-json"),
        pytest.param({"name": "has space"}, id="bad-name"),
    ],
)
def test_bad_schedules_are_refused_and_leave_nothing_registered(options: dict[str, Any]) -> None:
    queue = JobQueue()
    options = {"cron": "*/5 * * * *", **options}
    cron = options.pop("cron")
    with pytest.raises(TaskDefinitionError):
        queue.periodic(cron, **options)(handler)
    assert queue.tasks == {}
    assert queue.schedules == {}
    task = queue.task(handler)
    with pytest.raises(TaskDefinitionError):
        queue.periodic(cron, **options)(task)
    assert queue.tasks == {"handler": task}
    assert queue.schedules == {}


def test_schedule_names_are_unique_and_tasks_must_be_the_queues_own() -> None:
    queue = JobQueue()
    task = queue.task(handler)
    queue.periodic("0 * * * *")(task)
    with pytest.raises(TaskDefinitionError, match="name="):
        queue.periodic("30 * * * *")(task)
    queue.periodic("30 * * * *", name="handler_half_past")(task)
    assert set(queue.schedules) == {"handler", "handler_half_past"}
    other = JobQueue().task(handler)
    with pytest.raises(TaskDefinitionError, match="not registered"):
        queue.periodic("0 * * * *", name="foreign")(other)
    with pytest.raises(TaskDefinitionError):
        Schedule(name="direct", task=task, cron="0 * * * *", payload={"tick": "x"})


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
