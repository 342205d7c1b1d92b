"""Periodic schedules without a database: cron ticks across time zones and DST, declaring."""

from __future__ import annotations

import bisect
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim

from sa_jobqueue import JobContext, JobQueue
from sa_jobqueue.errors import TaskDefinitionError
from sa_jobqueue.periodic import Schedule, latest_tick, next_tick
from tests.helpers.jobs import handler

PARIS = ZoneInfo("Europe/Paris")


def at(text: str) -> datetime:
    """An aware datetime from ISO 8601 text with an offset."""
    moment = datetime.fromisoformat(text)
    assert moment.utcoffset() is not None
    return moment


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
