"""What each page shows, read in one transaction of the caller's: plain data, no HTML.

Every reader takes a Connection, reads, and commits nothing; the app runs each page's readers
in one read-only REPEATABLE READ transaction, so a page's figures come from one snapshot and
one ``now()``. Each statement is read through an index (the how-to page lists their plans).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar, Final

from sqlalchemy import Connection

from .._sql import dashboard as dashboard_sql
from .._sql import overview as overview_sql
from .._sql.clock import database_now
from .._sql.health import worker_freshness
from ..models import ATTEMPT_HISTORY_LIMIT
from ..ops.admin import JobSummary
from ..ops.filters import check_age
from ..ops.health import Finding, Thresholds, check
from ..ops.stats import WorkerInfo
from ..periodic import Schedule, latest_tick, next_tick
from ._attempts import AttemptRow, attempt_rows
from ._filters import JobFilter
from ._queue_reads import CHART_MINUTES, QueueRow, queue_rows, read_live_workers

#: Characters of JSON (payload, error) a job's page shows; the rest is cut, with a note.
MAX_CHARS: Final = 65_536
#: Characters of an error's type and message a list shows.
PREVIEW_CHARS: Final = 200


def now(conn: Connection) -> datetime:
    """The database's clock, as every page's figures are taken against it."""
    moment: datetime = conn.execute(database_now()).scalar_one()
    return moment


# -- overview --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Overview:
    """The overview page: queues, workers and the health findings."""

    as_of: datetime
    #: The queues of this page of the overview: up to :data:`QUEUES_SHOWN`, by name.
    queues: list[QueueRow]
    workers: list[WorkerInfo]
    #: Rows in the worker registry, live or not.
    registered_workers: int
    findings: list[Finding]
    #: How many queues there are to show, on all pages together.
    total_queues: int = 0
    #: This page's queues come after this name (None: the first page).
    queues_after: str | None = None
    #: The next page's queues come after this name (None: this page is the last one).
    next_queues: str | None = None


#: The most queues one page of the overview shows. An application with a queue per customer
#: has thousands: each row is a chart and two forms (10,000 of them took three seconds to
#: render), and the page reads the figures of its own queues alone (see ``_sql.overview``).
QUEUES_SHOWN: Final = 100


def read_overview(
    conn: Connection, thresholds: Thresholds, queues_after: str | None = None
) -> Overview:
    """Each queue's backlog (waiting, queued, due, running), dead jobs, last hour, paused state
    and limits (per key too), the live workers, and ``check``.

    Queues are shown :data:`QUEUES_SHOWN` at a time, by name, from past ``queues_after``.
    """
    as_of = now(conn)
    window = float(CHART_MINUTES * dashboard_sql.MINUTE)
    wanted = {"after": queues_after or "", "shown": QUEUES_SHOWN + 1, "window": window}
    total, names = conn.execute(overview_sql.queue_page(), wanted).one()
    # One name more than the page shows: whether it comes says if there is a page beyond.
    shown: list[str] = names[:QUEUES_SHOWN]
    stale = {"stale_after": check_age(thresholds.stale_after, "stale_after")}
    workers = read_live_workers(conn, stale["stale_after"])
    queues = queue_rows(conn, shown, workers)
    registered, _ = conn.execute(worker_freshness(), stale).one()
    findings = check(conn, thresholds)
    return Overview(
        as_of,
        queues,
        workers,
        registered,
        findings,
        total_queues=total,
        queues_after=queues_after,
        next_queues=shown[-1] if len(names) > QUEUES_SHOWN else None,
    )


# -- the jobs list ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ListedJob(JobSummary):
    """A job as the list shows it: no payload, the error's type and first characters.

    A page lists up to 500 jobs: their payloads (up to a megabyte each by default) and
    tracebacks are not read at all, only :data:`PREVIEW_CHARS` of each error.
    """

    error_type: str | None
    error_message: str | None
    #: The job's tags (None: it has none).
    tags: list[str] | None = None


@dataclass(frozen=True)
class JobPage:
    """One page of the jobs list, and where the pages around it start."""

    as_of: datetime
    filter: JobFilter
    jobs: list[ListedJob]
    #: The next page starts after this id (None: this page is the last one).
    next_after: int | None
    #: The previous page ends before this id (None: this is the first page).
    previous_before: int | None
    #: The ids this page searched, lowest first, when it searched no further than
    #: :data:`SCAN_WINDOW` ids and found less than a page: the next link goes on from there.
    searched: tuple[int, int] | None = None


#: The most ids one page of a filter that no partial index serves reads through the primary
#: key: a rare task among a million succeeded jobs would otherwise walk all of them for one
#: page. 50,000 rows (about 1,900 of the 8 kB table pages: 27 rows a page at 70% fill) take
#: some 25 ms from memory here and a few hundred from disk; 200,000 took 100 ms and seconds.
SCAN_WINDOW: Final = 50_000
#: Seconds by which a job's ``created_at`` may come before that of a job with a lower id: the
#: time its enqueuing transaction had run when it inserted the row. "Created over 1d ago"
#: searches the ids below those of the jobs created this much after the day's edge, and so
#: passes over a job only if its transaction ran longer than this before enqueuing it.
CREATED_SKEW: Final = 60.0


def read_jobs(conn: Connection, wanted: JobFilter) -> JobPage:
    """One page of jobs in id order, newest or oldest first, from the filter's position.

    Keyset pagination on the id: a page is "the next ``limit`` ids past this one", so pages
    neither repeat nor skip a job while others are added, run or deleted. A page before an id
    is read in the opposite order and turned around. A filter that no partial index serves
    reads at most :data:`SCAN_WINDOW` ids from the position; finding less than a page there,
    it says how far it looked (``searched``) and the next page goes on from that point.
    """
    backwards = wanted.before is not None
    newest_first = wanted.newest_first != backwards
    position = wanted.before if backwards else wanted.after
    as_of = now(conn)
    # One row more than the page shows: whether it comes says if there is a page beyond.
    params: dict[str, Any] = {"limit": wanted.limit + 1, "preview": PREVIEW_CHARS}
    if wanted.statuses:
        params["statuses"] = list(wanted.statuses)
    if wanted.queue is not None:
        params["queue"] = wanted.queue
    if wanted.task is not None:
        params["task"] = wanted.task
    if wanted.older_than is not None:
        params["older_than"] = check_age(wanted.older_than)
    if wanted.payload is not None:
        params["payload"] = wanted.payload
    if wanted.tags:
        params["tags"] = list(wanted.tags)
    edge: int | None = None
    reaches_end = True
    windowed = wanted.within is None
    if windowed:
        lowest, highest = conn.execute(dashboard_sql.id_range()).one()
        if lowest is not None and highest is not None and wanted.older_than is not None:
            # Jobs created over ``older_than`` ago hold the lowest ids: the ids searched end
            # where the jobs created since begin, however far down that is.
            since = {"older_than": params["older_than"], "skew": CREATED_SKEW}
            boundary = conn.execute(dashboard_sql.first_created_after(), since).scalar_one()
            highest = highest if boundary is None else min(highest, boundary - 1)
        if lowest is None or highest is None or highest < lowest:
            return JobPage(as_of, wanted, [], None, None)
        if newest_first:
            start = highest + 1 if position is None else min(position, highest + 1)
            edge = start - SCAN_WINDOW
            reaches_end = edge <= lowest
        else:
            start = lowest - 1 if position is None else position
            edge = min(start + SCAN_WINDOW, highest)
            reaches_end = edge >= highest
        params["window_edge"] = edge
        position = start
    if position is not None:
        params["after_id"] = position
    statement = dashboard_sql.job_page(
        within=wanted.within,
        statuses=bool(wanted.statuses),
        queue=wanted.queue is not None,
        task=wanted.task is not None,
        older_than=wanted.older_than is not None,
        after=position is not None,
        newest_first=newest_first,
        window=windowed,
        payload=wanted.payload is not None,
        tags=bool(wanted.tags),
    )
    jobs = [ListedJob(**row._asdict()) for row in conn.execute(statement, params)]
    beyond = len(jobs) > wanted.limit
    del jobs[wanted.limit :]
    # Cut short by the window: more may lie past its edge, and the way on starts there.
    cut = windowed and not beyond and not reaches_end
    onwards = jobs[-1].id if beyond else (edge if cut else None)
    searched = None
    if cut and edge is not None and position is not None:
        searched = (edge, position - 1) if newest_first else (position + 1, edge)
    if backwards:
        # Read from ``before`` away from it: turned around, the page ends next to it, and
        # the way forward (past its end) brings back the page that started at ``before``.
        jobs.reverse()
        assert wanted.before is not None
        # With no row, the way forward starts just short of ``before``, which it includes.
        step = 1 if wanted.newest_first else -1
        forward = jobs[-1].id if jobs else wanted.before + step
        return JobPage(as_of, wanted, jobs, forward, onwards, searched)
    previous_before = jobs[0].id if wanted.after is not None and jobs else None
    return JobPage(as_of, wanted, jobs, onwards, previous_before, searched)


# -- one job ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    """A moment in a job's life, for its timeline."""

    label: str
    at: datetime
    note: str = ""


@dataclass(frozen=True)
class JobDetail(JobSummary):
    """One job in full, its JSON as text cut to :data:`MAX_CHARS`, with the whole lengths.

    Not a :class:`~sa_jobqueue.JobInfo`: its values are text cut in the database (a page
    shows at most :data:`MAX_CHARS` of a payload, whole on its own link), and a row written
    some other way may hold an error that is not an object. It also shows what only the
    page needs: the worker, the lease, the backoff and the trace context.
    """

    as_of: datetime
    lease: timedelta
    worker: str | None
    unique_key: str | None
    payload: str
    payload_length: int
    #: ``jsonb_typeof`` of the last error: "object" as workers write it, None without one.
    error_kind: str | None
    error_json: str | None
    error_json_length: int | None
    error_type: str | None
    error_message: str | None
    error_message_length: int | None
    error_traceback: str | None
    error_traceback_length: int | None
    backoff: str | None
    trace_context: str | None
    #: ``attempt_history``'s entries, their fields apart and cut (see ``job_detail``).
    attempt_history: list[Any] | None = None
    #: The job's tags (None: it has none), and its meta as JSON text (at most 4 KB, whole).
    tags: list[str] | None = None
    meta: str | None = None
    #: The workflow the job belongs to (None: enqueued alone), and its step's name.
    workflow_id: int | None = None
    workflow_step: str | None = None
    #: The progress its handler last reported, as the worker wrote it (None: none reported
    #: by this attempt, or not written yet), its message, and when it was written.
    progress: float | None = None
    progress_message: str | None = None
    progress_at: datetime | None = None

    #: How many entries ``attempt_history`` keeps, for the page to say so.
    history_limit: ClassVar[int] = ATTEMPT_HISTORY_LIMIT

    @property
    def attempt_rows(self) -> list[AttemptRow]:
        """Each attempt's outcome, oldest first: its history, then the row's own attempt."""
        return attempt_rows(
            self.attempt_history,
            status=self.status,
            attempts=self.attempts,
            worker=self.worker,
            started_at=self.started_at,
            finished_at=self.finished_at,
        )

    @property
    def timeline(self) -> list[Event]:
        """What the row records of the job's life, in order (earlier attempts are not kept)."""
        events = [Event("enqueued", self.created_at)]
        if self.started_at is not None:
            events.append(
                Event(f"attempt {self.attempts} started", self.started_at, self.worker or "")
            )
        if self.status == "queued":
            label = "due" if self.visible_at <= self.as_of else "scheduled"
            note = "retry" if self.attempts else ""
            events.append(Event(label, self.visible_at, note))
        elif self.status == "running":
            expired = self.visible_at <= self.as_of
            events.append(Event("lease expired" if expired else "lease ends", self.visible_at))
        if self.finished_at is not None:
            events.append(Event(self.status, self.finished_at))
        return sorted(events, key=lambda e: e.at)


def read_job(conn: Connection, job_id: int) -> JobDetail | None:
    """Job ``job_id`` for its page; None if there is no such job."""
    as_of = now(conn)
    row = (
        conn.execute(dashboard_sql.job_detail(), {"job_id": job_id, "max_chars": MAX_CHARS})
        .mappings()
        .one_or_none()
    )
    return None if row is None else JobDetail(as_of=as_of, **row)


def read_payload(conn: Connection, job_id: int) -> str | None:
    """Job ``job_id``'s whole payload as JSON text; None if there is no such job."""
    text: str | None = conn.execute(dashboard_sql.job_payload(), {"job_id": job_id}).scalar()
    return text


# -- periodic schedules ----------------------------------------------------------------------


@dataclass(frozen=True)
class ScheduleRow:
    """A periodic schedule: as stored, as declared, or both."""

    name: str
    #: The last tick enqueued (None: declared, but no worker has seen it yet).
    last_tick: datetime | None
    #: What the application declares; None when the dashboard was not given the application,
    #: or the application no longer declares this schedule.
    schedule: Schedule | None
    next_tick: datetime | None
    #: A tick at or before now that is not enqueued yet (a worker enqueues it within a second
    #: or so; one that stays overdue means no worker is running).
    overdue_tick: datetime | None


@dataclass(frozen=True)
class Schedules:
    """The periodic page."""

    as_of: datetime
    rows: list[ScheduleRow]
    #: Whether the application's declarations were given (cron, time zone, next tick).
    declared: bool


def read_schedules(conn: Connection, declared: Mapping[str, Schedule] | None) -> Schedules:
    """The stored schedules, with the application's declarations when it is given."""
    as_of = now(conn)
    stored = {name: tick for name, tick in conn.execute(dashboard_sql.schedules())}
    names: Sequence[str] = sorted(stored.keys() | (declared or {}).keys())
    rows = []
    for name in names:
        schedule = (declared or {}).get(name)
        last = stored.get(name)
        upcoming = overdue = None
        if schedule is not None:
            upcoming = next_tick(schedule.cron, schedule.zone, as_of)
            latest = latest_tick(schedule.cron, schedule.zone, as_of)
            if last is not None and latest is not None and latest > last:
                overdue = latest
        rows.append(ScheduleRow(name, last, schedule, upcoming, overdue))
    return Schedules(as_of, rows, declared is not None)
