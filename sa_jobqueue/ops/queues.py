"""Flow control per queue: pause and resume a queue, list the queues and what holds them back.

Each function takes a Session, scoped_session or Connection, runs in its transaction and never
commits: a pause takes effect, for every worker of the cluster, when the caller commits, and a
rollback leaves the queue as it was. A bad queue name raises InvalidNameError before any SQL.

What is not promised: a pause stops *starting* jobs, not running ones. A job already claimed
when the pause commits (a claim that had begun, or jobs buffered in a worker waiting for a free
slot) still runs. Expired leases of a paused queue are not reclaimed until it resumes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from .._binds import SessionLike, connection_of
from .._enqueue import wake
from .._sql import queues as queues_sql
from .._sql.stats import live_per_queue
from .._validation import check_queue_name


@dataclass(frozen=True)
class QueueInfo:
    """One queue as :func:`list_queues` sees it: its live jobs and its flow settings."""

    queue: str
    #: Queued jobs, due or not.
    queued: int
    #: Queued jobs whose time has come.
    due: int
    running: int
    #: How long the oldest due job has been due; None if none is.
    oldest_due_age: timedelta | None
    #: When the queue was paused (database clock); None while it runs.
    paused_at: datetime | None

    @property
    def held_back_by(self) -> list[str]:
        """What stops due jobs of the queue from starting now, in words ("paused"); empty if
        nothing does but the workers' free slots."""
        return ["paused"] if self.paused_at is not None else []


def pause_queue(session: SessionLike, queue: str) -> bool:
    """Pause ``queue`` in the caller's transaction: once it commits, no worker starts its jobs.

    True if this paused it, False if it was paused already (its ``paused_at`` is kept). Its
    jobs stay queued, enqueueing into it goes on, and jobs already running finish. The queue
    need not have jobs yet, or workers.
    """
    name = check_queue_name(queue)
    conn = connection_of(session)
    return conn.execute(queues_sql.pause(), {"b_queue": name}).first() is not None


def resume_queue(session: SessionLike, queue: str) -> bool:
    """Resume ``queue`` in the caller's transaction; its workers are woken when it commits.

    True if it was paused. The wake-up is the NOTIFY enqueue sends, so idle workers claim at
    once rather than at their next poll; a rollback sends nothing and leaves the queue paused.
    """
    name = check_queue_name(queue)
    conn = connection_of(session)
    if conn.execute(queues_sql.resume(), {"b_queue": name}).first() is None:
        return False
    wake(conn, name)
    return True


def paused_queues(session: SessionLike) -> dict[str, datetime]:
    """The paused queues, each with when it was paused (database clock)."""
    rows = connection_of(session).execute(queues_sql.paused_queues())
    return {name: at for name, at in rows}


def list_queues(session: SessionLike) -> list[QueueInfo]:
    """Every queue with queued or running jobs, or paused, sorted by name.

    Reads the claim index (live jobs only, never finished history) and the queues table.
    """
    conn = connection_of(session)
    live = {row[0]: row[1:] for row in conn.execute(live_per_queue())}
    paused = paused_queues(conn)
    return [
        QueueInfo(name, *live.get(name, (0, 0, 0, None)), paused_at=paused.get(name))
        for name in sorted(live.keys() | paused.keys())
    ]
