"""The queues as the overview and the queue page show them: backlog, limits, what holds
each back, read in the caller's transaction like :mod:`._reads`."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any, Final

from sqlalchemy import Connection

from .._sql import dashboard as dashboard_sql
from .._sql import history as history_sql
from .._sql import overview as overview_sql
from .._sql.clock import database_now
from .._sql.stats import live_workers
from ..models import FINISHED_STATUSES
from ..ops.queues import QueueInfo, QueueLimits
from ..ops.stats import WorkerInfo

#: How far back the throughput chart looks, in one bar per minute.
CHART_MINUTES: Final = 60
#: The long history's spans, in hours: this hour (folded so far) and the 23 before it; this
#: hour and the 167 before it. The queue page draws a bar per hour of each.
DAY_HOURS: Final = 24
WEEK_HOURS: Final = 168
_HOUR: Final = 3_600


@dataclass(frozen=True)
class QueueRow:
    """One queue on the overview."""

    name: str
    #: Jobs waiting for their dependencies (they become queued once those have ended).
    waiting: int = 0
    queued: int = 0
    due: int = 0
    running: int = 0
    dead: int = 0
    #: How long the oldest due job has waited; None if none is due.
    oldest_due: timedelta | None = None
    #: Jobs finished in the chart's hour, per finished status.
    finished: dict[str, int] = field(default_factory=dict)
    #: Per finished status, the jobs of each minute of the hour, oldest minute first.
    per_minute: dict[str, list[int]] = field(default_factory=dict)
    #: When the queue was paused; None while it runs.
    paused_at: datetime | None = None
    #: Its limits, per key too (each None when not set), as ``sa-jobqueue queues`` shows them.
    limits: QueueLimits = field(default_factory=QueueLimits)
    #: Jobs started in the rate limit's current window.
    rate_used: int = 0
    #: Running jobs with a live lease: those holding slots of its cap.
    holding: int = 0
    #: Whether a live worker serves it.
    served: bool = True
    #: Jobs finished in the last :data:`DAY_HOURS` and :data:`WEEK_HOURS` hours, per finished
    #: status, from the hourly history (empty before the first fold).
    day: dict[str, int] = field(default_factory=dict)
    week: dict[str, int] = field(default_factory=dict)

    @property
    def held_back_by(self) -> list[str]:
        """What stops its due jobs from starting, in the CLI's words ("paused", "at cap",
        "rate limit"), and "no worker" when it has jobs to run and no live worker serves it."""
        info = QueueInfo(
            self.name,
            self.queued,
            self.due,
            self.running,
            self.oldest_due,
            self.paused_at,
            limits=self.limits,
            rate_used=self.rate_used,
            holding=self.holding,
        )
        held = info.held_back_by
        if not self.served and (self.queued or self.running):
            held.append("no worker")
        return held

    @cached_property
    def busiest_minute(self) -> int:
        """The most jobs finished in one minute of the hour (the chart's scale)."""
        totals = [sum(col) for col in zip(*self.per_minute.values(), strict=True)]
        return max(totals, default=0)


def queue_rows(conn: Connection, shown: list[str], workers: list[WorkerInfo]) -> list[QueueRow]:
    """The overview's rows of the queues ``shown``; ``workers``: the live ones."""
    page = {"names": shown, "window": float(CHART_MINUTES * dashboard_sql.MINUTE)}
    rows: dict[str, dict[str, Any]] = {name: {} for name in shown}
    for name, queued, due, running, oldest, holding in conn.execute(
        overview_sql.live_on_page(), page
    ):
        rows[name].update(
            queued=queued, due=due, running=running, oldest_due=oldest, holding=holding
        )
    for name, dead in conn.execute(overview_sql.dead_on_page(), page):
        rows[name]["dead"] = dead
    for name, waiting in conn.execute(overview_sql.waiting_on_page(), page):
        rows[name]["waiting"] = waiting
    minutes: dict[str, dict[str, list[int]]] = {}
    for name, status, minute, n in conn.execute(overview_sql.finished_on_page(), page):
        series = minutes.setdefault(name, {s: [0] * CHART_MINUTES for s in FINISHED_STATUSES})
        if 0 <= minute < CHART_MINUTES:  # the window's first instant can round to minute 60
            series[status][CHART_MINUTES - 1 - minute] += n
    for name, paused_at in conn.execute(overview_sql.paused_on_page(), page):
        rows[name]["paused_at"] = paused_at
    for limits in conn.execute(overview_sql.limits_on_page(), page):
        name, cap, count, period, used, key_cap, key_field, key_count, key_period = limits
        rows[name].update(
            limits=QueueLimits._of(cap, count, period, key_cap, key_field, key_count, key_period),
            rate_used=used,
        )
    spans = {"names": shown, "day": float((DAY_HOURS - 1) * _HOUR)}
    spans["week"] = float((WEEK_HOURS - 1) * _HOUR)
    for totals in conn.execute(history_sql.totals_on_page(), spans).mappings():
        rows[totals["queue"]].update(
            day={s: totals[f"day_{s}"] or 0 for s in FINISHED_STATUSES},
            week={s: totals[f"week_{s}"] for s in FINISHED_STATUSES},
        )
    served = {name for worker in workers for name in worker.queues}
    return [
        QueueRow(
            name=name,
            **rows[name],
            served=name in served,
            finished={s: sum(v) for s, v in minutes.get(name, {}).items()},
            per_minute=minutes.get(name, {}),
        )
        for name in shown
    ]


@dataclass(frozen=True)
class QueuePage:
    """The queue page: its row as the overview shows it, and the live workers serving it."""

    as_of: datetime
    queue: QueueRow
    workers: list[WorkerInfo]
    #: Per finished status, its jobs in each of the last :data:`WEEK_HOURS` hours, oldest
    #: first (the last: this hour, folded so far).
    hours: dict[str, list[int]] = field(default_factory=dict)
    #: How far the history is folded in: later finishes are not in ``hours`` yet.
    folded_to: datetime | None = None

    @property
    def busiest_hour(self) -> int:
        """The most jobs finished in one hour of the week (the charts' scale)."""
        return max((sum(col) for col in zip(*self.hours.values(), strict=True)), default=0)

    def last(self, hours: int) -> dict[str, list[int]]:
        """``hours`` as the last ``hours`` hours of each status."""
        return {status: counts[-hours:] for status, counts in self.hours.items()}


def read_live_workers(conn: Connection, stale_after: float) -> list[WorkerInfo]:
    """The workers whose heartbeat is younger than ``stale_after`` seconds, by name."""
    return [WorkerInfo(*row) for row in conn.execute(live_workers(), {"stale_after": stale_after})]


def read_queue(conn: Connection, name: str, stale_after: float) -> QueuePage:
    """Queue ``name`` (any valid name: a queue may be paused or limited before its first job)."""
    as_of: datetime = conn.execute(database_now()).scalar_one()
    workers = read_live_workers(conn, stale_after)
    (row,) = queue_rows(conn, [name], workers)
    hours = {status: [0] * WEEK_HOURS for status in FINISHED_STATUSES}
    span = {"names": [name], "span": float((WEEK_HOURS - 1) * _HOUR)}
    for hour in conn.execute(history_sql.hours_on_page(), span).mappings():
        if 0 <= hour["hours_ago"] < WEEK_HOURS:
            for status in FINISHED_STATUSES:
                hours[status][WEEK_HOURS - 1 - hour["hours_ago"]] = hour[status]
    folded_to = conn.execute(history_sql.folded_to()).scalar()
    serving = [w for w in workers if name in w.queues]
    return QueuePage(as_of, row, serving, hours, folded_to)
