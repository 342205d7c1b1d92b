"""``stats``: counts per queue and status, backlog ages, recent outcomes, run times, workers.

Every figure is computed by the database against its own ``now()``; Python passes durations
only. What is not promised: the figures are a snapshot, not a consistent accounting (counts and
ages come from separate statements).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import Connection

from .._sql.admin import counts
from .._sql.clock import database_now
from .._sql.queues import paused_queues
from .._sql.stats import due_per_queue, finished_per_queue, live_workers, run_times
from ..models import FINISHED_STATUSES, STATUSES
from .filters import check_age
from .queues import QueueLimits, limits_in_use


@dataclass(frozen=True)
class QueueStats:
    """One queue: jobs per status, what is due now, and what finished within the window."""

    queue: str
    #: Jobs per status, every status present (0 if none).
    counts: dict[str, int]
    #: Queued jobs whose time has come (``visible_at <= now()``).
    due: int
    #: How long the oldest due job has been due; None if none is.
    oldest_due_age: timedelta | None
    #: Jobs that finished within the window, per finished status (succeeded, dead, cancelled).
    finished: dict[str, int]
    #: When the queue was paused (see :func:`~sa_jobqueue.ops.pause_queue`); None if it runs.
    paused_at: datetime | None = None
    #: Its cap and rate limit (see :func:`~sa_jobqueue.ops.set_queue_concurrency`).
    limits: QueueLimits = field(default_factory=QueueLimits)
    #: Jobs started in the current rate window (0 without a rate limit).
    rate_used: int = 0


@dataclass(frozen=True)
class TaskRunTimes:
    """Run times of one task's jobs that finished within the window."""

    task: str
    jobs: int
    p50: timedelta
    p99: timedelta


@dataclass(frozen=True)
class WorkerInfo:
    """One row of the worker registry."""

    name: str
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    started_at: datetime
    last_seen_at: datetime


@dataclass(frozen=True)
class Stats:
    """What :func:`stats` returns: per queue, per task, and the live workers."""

    #: The database's ``now()`` the figures were taken at.
    as_of: datetime
    #: How far back "finished" and the run times look.
    window: timedelta
    queues: list[QueueStats]
    tasks: list[TaskRunTimes]
    workers: list[WorkerInfo]


def stats(
    conn: Connection,
    *,
    window: timedelta = timedelta(minutes=10),
    stale_after: timedelta = timedelta(minutes=1),
) -> Stats:
    """Counts per queue and status, backlog ages, recent outcomes, run times and live workers.

    Paused and limited queues are listed (with when they were paused, and their limits) even
    when they hold no jobs.

    Jobs finished within ``window`` are counted per queue, and their run times give each
    task's p50 and p99 (``percentile_cont``). Workers are live if their heartbeat was seen
    within ``stale_after``. Reads only; runs in ``conn``'s transaction and does not commit.

    Cost: the status counts read the whole table, history included; the run times sort the
    jobs finished within ``window``. Cheap at a few hundred thousand rows, not free at many
    millions; a short ``window`` keeps the percentiles cheap.
    """
    params = {
        "window": check_age(window, "window"),
        "stale_after": check_age(stale_after, "stale_after"),
    }
    as_of: datetime = conn.execute(database_now()).scalar_one()
    per_status: dict[str, dict[str, int]] = {}
    for queue, status, n in conn.execute(counts()):
        per_status.setdefault(queue, {})[status] = n
    due = {queue: (n, age) for queue, n, age in conn.execute(due_per_queue())}
    finished: dict[str, dict[str, int]] = {}
    for queue, status, n in conn.execute(finished_per_queue(), params):
        finished.setdefault(queue, {})[status] = n
    paused = {name: at for name, at in conn.execute(paused_queues())}
    limited = limits_in_use(conn)
    queues = [
        QueueStats(
            queue=queue,
            counts={s: per_status.get(queue, {}).get(s, 0) for s in STATUSES},
            due=due.get(queue, (0, None))[0],
            oldest_due_age=due.get(queue, (0, None))[1],
            finished={s: finished.get(queue, {}).get(s, 0) for s in FINISHED_STATUSES},
            paused_at=paused.get(queue),
            limits=limited.get(queue, (QueueLimits(), 0))[0],
            rate_used=limited.get(queue, (QueueLimits(), 0))[1],
        )
        for queue in sorted(per_status.keys() | finished.keys() | paused.keys() | limited.keys())
    ]
    tasks = [
        TaskRunTimes(task, n, p50, p99) for task, n, p50, p99 in conn.execute(run_times(), params)
    ]
    workers = [WorkerInfo(*row) for row in conn.execute(live_workers(), params)]
    return Stats(as_of=as_of, window=window, queues=queues, tasks=tasks, workers=workers)
