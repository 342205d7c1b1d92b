"""Periodic (cron) jobs: schedules declared with ``@queue.periodic``, and :func:`enqueue_due`.

A schedule runs a task on a cron expression in a time zone::

    @queue.periodic("0 3 * * *", timezone="Europe/Paris", payload={"report": "daily"})
    @queue.task(queue="reports")
    def nightly_report(ctx, payload):
        ...  # payload == {"report": "daily", "tick": "2026-03-29T03:00:00+02:00"}

Workers call :func:`enqueue_due` about once a second. For each schedule whose latest tick (the
most recent moment the expression names, at or before the database's ``now()``) is later than
the ``last_tick`` stored in ``sa_jobqueue_periodic``, it moves ``last_tick`` to that tick with a
compare-and-set and inserts the job in the same statement. However many processes call it at
once, each tick is enqueued by exactly one of them; there is no leader to elect.

Policies, where cron itself leaves a choice:

* **Missed ticks are not caught up.** If no process called :func:`enqueue_due` for a while (no
  worker was running), the next call enqueues the most recent missed tick, once, and skips the
  older ones.
* **A new schedule starts with its next tick.** The first call that sees a schedule records it
  with ``last_tick = now()``, so its first job is for the first tick after that moment: a
  daily 03:00 job deployed at 14:00 first runs at 03:00 the next day, not at once.
* **The schedule's name is its identity** (the task's name unless ``name=`` is given). Changing
  its cron expression keeps its ``last_tick``; renaming it starts a new schedule.
* **Daylight saving time follows Debian's cron** (cronsim's behaviour). A job at a fixed time
  of day that falls in the hour skipped in spring runs at the end of the gap (02:30 runs at
  03:00); one that falls in the hour repeated in autumn runs once, at its first occurrence.
  Expressions whose minute or hour field starts with ``*`` (``*/15 * * * *``) follow real
  elapsed time, so they run through both passes of a repeated hour.
* **A tick whose unique key is held is skipped.** If the task declares ``unique_key`` and a live
  job holds the tick's key, the tick is consumed and no job is added (e.g. to never queue a run
  behind one that is still running).

What is not promised: running at the tick's exact moment. The job is enqueued when a process
next calls :func:`enqueue_due` after the tick (about a second later with a worker running), and
then waits for a free worker like any job. The job carries its tick in its payload under
``"tick"`` (ISO 8601, in the schedule's time zone), so a late run knows which tick it serves.

The cron expressions are parsed and evaluated by ``cronsim``: five fields (minute, hour, day of
month, month, day of week), with ranges, steps, lists, names (``MON``, ``JAN``), ``L`` and
``#``; day of month and day of week combine as in Debian's cron.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from sqlalchemy import Connection, Engine

from ._enqueue.jobs import new_jobs
from ._enqueue.options import resolve_options
from ._payloads import encode_payload
from ._sql import clock
from ._sql import periodic as periodic_sql
from ._validation import TASK_NAME
from .errors import InvalidJobError, TaskDefinitionError
from .tasks import Task

#: The payload key that carries the tick a periodic job serves.
TICK_KEY: Final = "tick"


# Instants are compared and shifted in UTC only. Two datetimes of one ZoneInfo compare (and add
# timedeltas) by wall-clock time, blind to ``fold``: in an hour repeated in autumn, 02:30 of the
# first pass would equal 02:30 of the second, and 02:59:59 + 1 s would be 03:00 an hour later.


def latest_tick(cron: str, zone: ZoneInfo, now: datetime) -> datetime | None:
    """The latest tick of ``cron`` in ``zone`` at or before ``now``; None if none in 50 years.

    The tick is an aware datetime in ``zone``. ``now`` must be aware.
    """
    now = now.astimezone(UTC)
    # Ticks are whole seconds: from one second past ``now`` (floored), the first tick backwards
    # is the latest one at or before ``now``.
    start = (now.replace(microsecond=0) + timedelta(seconds=1)).astimezone(zone)
    try:
        tick = next(CronSim(cron, start, reverse=True))
    except StopIteration:
        return None
    # Walking backwards from inside an hour repeated in autumn can miss the first pass's tick
    # (02:30 +02:00 seen from 02:10 +01:00 comes out as yesterday's), and forward iteration is
    # what defines the schedule: step forward over any tick that is still at or before now.
    for later in CronSim(cron, tick):
        if later.astimezone(UTC) > now:
            break
        tick = later
    return tick


def next_tick(cron: str, zone: ZoneInfo, after: datetime) -> datetime | None:
    """The first tick of ``cron`` in ``zone`` after ``after``; None if none within 50 years."""
    return next(CronSim(cron, after.astimezone(zone)), None)


def _utc(moment: datetime) -> datetime:
    return moment.astimezone(UTC)


@dataclass(frozen=True, eq=False)
class Schedule:
    """A task's cron schedule, as ``@queue.periodic`` declares it (see the module docstring).

    ``payload`` is the job's payload without its ``"tick"``. Invalid options raise
    TaskDefinitionError at declaration, and so does a payload that, with its ``"tick"`` (ISO
    8601 text), does not fit the type of a task with a typed payload (a dataclass or a
    TypedDict takes it with a ``tick`` field of type ``datetime`` or ``str``).
    """

    name: str
    task: Task
    cron: str
    timezone: str = "UTC"
    payload: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not TASK_NAME.fullmatch(self.name):
            raise TaskDefinitionError(
                f"invalid schedule name {self.name!r}: use 1-200 characters from"
                " A-Z a-z 0-9 _ . : -, starting with a letter or underscore"
            )
        where = f"schedule {self.name!r}"
        if not isinstance(self.cron, str) or len(self.cron.split()) != 5:
            raise TaskDefinitionError(
                f"{where}: {self.cron!r} is not a cron expression of five fields"
                " (minute hour day-of-month month day-of-week)"
            )
        try:
            zone = ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError, TypeError):
            raise TaskDefinitionError(
                f"{where}: unknown time zone {self.timezone!r} (use an IANA name such as"
                " 'Europe/Paris' or 'UTC')"
            ) from None
        try:
            first = next_tick(self.cron, zone, datetime.now(zone))
        except CronSimError as exc:
            raise TaskDefinitionError(
                f"{where}: bad cron expression {self.cron!r}: {exc}"
            ) from None
        if first is None:
            raise TaskDefinitionError(f"{where}: {self.cron!r} names no time in the next 50 years")
        if not isinstance(self.payload, Mapping) or TICK_KEY in self.payload:
            raise TaskDefinitionError(
                f"{where}: the payload must be a dict without a {TICK_KEY!r} key (the job's"
                f" payload is that dict plus {TICK_KEY!r})"
            )
        object.__setattr__(self, "payload", dict(self.payload))
        try:
            payload: Any = self.job_payload(first)
            codec = self.task.payload_codec
            if codec is not None:
                # A typed task: its jobs' payloads (this dict and the tick) must fit its type.
                _, payload = codec.prepare(payload)
            encode_payload(payload)
        except InvalidJobError as exc:
            raise TaskDefinitionError(f"{where}: {exc}") from None

    @property
    def zone(self) -> ZoneInfo:
        """The schedule's time zone."""
        return ZoneInfo(self.timezone)  # ZoneInfo caches its instances

    def latest_tick(self, now: datetime) -> datetime | None:
        """The latest tick at or before ``now`` (see :func:`latest_tick`)."""
        # Not cached between calls: it costs tens of microseconds, and a cache keyed on the
        # next tick would inherit any gap in cronsim's forward iteration (it skips ticks after
        # Lord Howe Island's half-hour change, which walking backwards finds).
        return latest_tick(self.cron, self.zone, now)

    def job_payload(self, tick: datetime) -> dict[str, Any]:
        """The payload of the job for ``tick``: the declared payload plus ``"tick"``."""
        return {**self.payload, TICK_KEY: tick.astimezone(self.zone).isoformat()}


class ScheduleSource(Protocol):
    """What :func:`enqueue_due` reads of a :class:`~sa_jobqueue.JobQueue`: its schedules and
    its payload size limit. Any JobQueue is one."""

    @property
    def schedules(self) -> Mapping[str, Schedule]:
        """The declared schedules by name."""
        ...

    @property
    def max_payload_bytes(self) -> int:
        """The largest payload a job may carry, as encoded JSON."""
        ...


def enqueue_due(
    bind: Engine | Connection, queue: ScheduleSource, *, now: datetime | None = None
) -> int:
    """Enqueue one job for each schedule of ``queue`` whose latest tick is not enqueued yet.

    Returns how many jobs were enqueued. Safe to call from any number of processes at once:
    each tick is enqueued by exactly one call (a compare-and-set on ``last_tick`` and the job's
    insert are one statement). Costs two cheap reads when nothing is due, so a worker can call
    it every second.

    With an Engine it commits before it returns. With a Connection it runs in that
    connection's transaction and commits nothing (on an autocommit connection each tick is its
    own transaction). ``now`` defaults to the database's ``now()``; pass an aware datetime
    only to test. Database errors, and errors raised by a task's ``unique_key`` function,
    propagate.
    """
    schedules = queue.schedules
    if not schedules:
        return 0
    if now is not None and now.utcoffset() is None:
        raise ValueError("now must be a timezone-aware datetime")
    max_payload_bytes = queue.max_payload_bytes
    if isinstance(bind, Engine):
        with bind.begin() as conn:
            return _enqueue_due(conn, list(schedules.values()), max_payload_bytes, now)
    return _enqueue_due(bind, list(schedules.values()), max_payload_bytes, now)


def _enqueue_due(
    conn: Connection, schedules: list[Schedule], max_payload_bytes: int, now: datetime | None
) -> int:
    if now is None:
        now = conn.execute(clock.database_now()).scalar_one()
    # In name order: two processes that each move several schedules in one transaction then
    # lock their rows in the same order, and cannot deadlock (even running different code).
    ordered = sorted(schedules, key=lambda s: s.name)
    due = {s.name: (s, tick) for s in ordered if (tick := s.latest_tick(now)) is not None}
    if not due:
        return 0
    stored: dict[str, datetime] = {
        name: last for name, last in conn.execute(periodic_sql.last_ticks(), {"names": list(due)})
    }
    new = [name for name in due if name not in stored]
    if new:
        # A schedule seen for the first time starts at ``now``: its first job is its next tick.
        conn.execute(periodic_sql.add_schedules(), {"names": new, "now": now})
    enqueued = 0
    for name, (schedule, tick) in due.items():
        last = stored.get(name)
        if last is None or _utc(last) >= _utc(tick):
            continue  # new, or this tick (or a later one) is already enqueued
        # The task's own options, as an enqueue without overrides would give them; the job is
        # due at once (the statement uses now()) and carries no trace context.
        job = new_jobs(
            resolve_options(schedule.task),
            [schedule.job_payload(tick)],
            [None],
            max_payload_bytes=max_payload_bytes,
        )
        key = job.keys[0]
        params = {"schedule": name, "tick": tick, **job.params("b_"), "b_payload": job.payloads[0]}
        if key is not None:
            params["b_unique_key"] = key
        statement = periodic_sql.enqueue_tick(key is not None, job.options.labelled)
        if conn.execute(statement, params).first() is not None:
            enqueued += 1
    return enqueued
