"""Group commit: fast writing jobs of one thread share a transaction, a savepoint each.

Jobs that write through their session share one transaction, a savepoint each, with the jobs
their thread runs right after them, so that many jobs cost one commit (one fsync) and one
completing statement instead of one each. If any of them can no longer complete (cancelled,
or its lease lost), the whole group rolls back and the others are handed back to run again:
rare enough to cost nothing, and no job's writes ever commit without its completion.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import cast

from sqlalchemy import Connection, Engine, RootTransaction
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from ..tasks import JobContext, Task
from ._claimed import Claimed
from ._lanes import Lane
from ._leases import LeaseTable
from ._recorder import Recorder
from ._sessions import GroupSession, aborted, broken, deadline, group_engine
from ._settlement import Complete, settle, shutting_down

log = logging.getLogger("sa_jobqueue.worker")

#: Only tasks whose handlers recently ran faster than GROUP_FAST seconds (a moving average)
#: join a group: for them the commit is a large part of the cost, and a group of them holds
#: its handlers' row locks only briefly. A group commits when it has GROUP_MAX_JOBS jobs, is
#: GROUP_MAX_AGE seconds old, its thread finds no job waiting for GROUP_IDLE seconds, or a
#: slower task is next. GROUP_MAX_JOBS stays below 64: each job's savepoint that writes takes
#: a subtransaction id, and past 64 in one transaction PostgreSQL overflows its per-backend
#: cache of them, which slows every other session's snapshots.
GROUP_FAST = 0.02
GROUP_MAX_JOBS = 50
GROUP_MAX_AGE = 0.05
GROUP_IDLE = 0.001


@dataclass
class Group:
    """A job thread's open transaction, shared by the fast writing jobs it runs in a row."""

    conn: Connection
    tx: RootTransaction
    opened: float = field(default_factory=time.monotonic)
    done: list[Claimed] = field(default_factory=list)  # succeeded, completion pending

    @property
    def intact(self) -> bool:
        """The shared transaction is still the connection's, and still open.

        A job's savepoint protects the others only from what happens inside it; should
        anything ever end the shared transaction itself, the jobs it held lost their writes
        and must not be completed (see :meth:`Groups.commit`)."""
        return (
            not broken(self.conn)
            and self.tx.is_active
            and self.conn.get_transaction() is self.tx
            and not aborted(self.conn)
        )

    @property
    def due(self) -> bool:
        """Big or old enough to commit now."""
        return len(self.done) >= GROUP_MAX_JOBS or time.monotonic() - self.opened >= GROUP_MAX_AGE


class ThreadState:
    """What one job thread carries from job to job: its open group and its connection."""

    __slots__ = ("conn", "group", "lane")

    def __init__(self, lane: Lane) -> None:
        self.lane = lane
        self.group: Group | None = None
        self.conn: Connection | None = None  # kept between groups while work is waiting


class Groups:
    """Opens, fills, settles the jobs of, and commits the job threads' groups.

    What it does not promise: that a group's jobs complete. A job that cannot (cancelled,
    lease lost) takes the others' writes down with it; they are handed back to run again.
    """

    def __init__(
        self, engine: Engine, leases: LeaseTable, recorder: Recorder, wake: threading.Event
    ) -> None:
        # Its connections keep their jobs' savepoints until the group ends (see the view).
        self._engine = group_engine(engine)
        self._leases = leases
        self._recorder = recorder
        self._wake = wake

    def session(self, here: ThreadState, until: float | None = None) -> Session:
        """A grouped job's session: a savepoint in its thread's group (opened if need be).

        ``until``: when its task's timeout runs out (see ``_sessions.UNTIL``)."""
        if here.group is not None and not here.group.intact:
            self.commit(here)  # hands its jobs back: it cannot commit them any more
        if here.group is None:
            if here.conn is not None and broken(here.conn):
                drop_connection(here)  # lost while it waited for this group: a fresh one
            if here.conn is None:
                here.conn = self._engine.connect()
            here.group = Group(here.conn, here.conn.begin())
            self._leases.group_opened()
        return GroupSession(here.group.conn, until)

    def settle(
        self,
        here: ThreadState,
        job: Claimed,
        task: Task,
        ctx: JobContext,
        failure: Exception | None,
    ) -> None:
        """A grouped job's outcome: its savepoint joins the group (its completion goes out
        with the group's commit), or is rolled back and its verdict recorded now."""
        session = cast(GroupSession, ctx.session)
        try:
            assert here.group is not None
            stop = ctx._stop  # lost, timed out, cancelled; a shutdown lets it complete
            verdict = settle(
                failure,
                wrote=True,
                grouped=True,
                stop_requested=stop,
                shutting_down=shutting_down(ctx),
                aborted=failure is None and not stop and aborted(here.group.conn),
            )
            if isinstance(verdict, Complete):
                try:
                    session.commit_for_real()  # ends its savepoint; the server keeps it
                except SQLAlchemyError as exc:
                    verdict = settle(exc, wrote=True, grouped=True)
                else:
                    # Its lease is renewed until the group commits.
                    self._leases.await_group(job)
                    here.group.done.append(job)
                    return
            session.rollback()
        finally:
            session.close()
        self._recorder.record(job, verdict, task)

    def commit(self, here: ThreadState) -> None:
        """Complete the group's jobs in one fenced statement and commit their work with it.

        Never raises: a job thread must outlive any trouble its group meets.
        """
        group, here.group = here.group, None
        if group is None:
            return
        try:
            self._end(here, group)
        except Exception:  # pragma: no cover - a bug of ours; the leases settle the jobs
            log.exception("internal error while committing %d job(s)", len(group.done))
            # Whatever went wrong, the thread goes on with a fresh connection, and the jobs
            # whose outcome is unknown are left to their leases: reclaimed, and fenced.
            drop_connection(here, lost=True)
            self._leases.forget(group.done)
            self._recorder.lost(group.done)
        finally:
            self._leases.group_closed()
            if self._leases.burst:
                self._wake.set()  # a burst ends only once no group is open

    def _end(self, here: ThreadState, group: Group) -> None:
        jobs = group.done
        if broken(group.conn):
            # The connection was lost (a terminated backend, a pooler restart): the jobs'
            # writes went with it. Their leases are ended, so they are reclaimed (their
            # attempt counted, as for a crash) and run again; a commit that did reach the
            # server before the loss is fenced, so nothing runs twice to completion.
            drop_connection(here, lost=True)
            self._leases.forget(jobs)
            if jobs:
                self._recorder.unrecorded(jobs, None)
            return
        if not group.intact:
            # Something ended the shared transaction early: its jobs' writes are gone, so
            # they must not be completed. They go back to the queue, to run again.
            drop_connection(here)
            self._leases.forget(jobs)
            if jobs:
                self._recorder.hand_back(
                    jobs, "their shared transaction ended early", report=True, ran=True
                )
            return
        try:
            with deadline(group.conn):
                done = self._recorder.complete_group(group.conn, jobs)
                if len(done) == len(jobs):
                    group.conn.commit()
                else:
                    group.conn.rollback()
        except SQLAlchemyError as exc:
            # Nothing of these jobs was written, their completions included: they are still
            # running in the database, and run again once their leases are ended.
            drop_connection(here, lost=True)
            self._leases.forget(jobs)
            if jobs:
                self._recorder.unrecorded(jobs, exc)
            return
        if here.lane.buffer_empty:
            drop_connection(here)  # else keep it for the next group: work is waiting
        self._leases.forget(jobs)
        self._recorder.completed_together(jobs, done, "their shared transaction was rolled back")


def drop_connection(here: ThreadState, *, lost: bool = False) -> None:
    """Give the thread's kept connection back to the pool, or discard it if it is ``lost``
    (or turns out to be). Never raises: the thread goes on with a fresh one next time."""
    conn, here.conn = here.conn, None
    if conn is None:
        return
    try:
        if lost or broken(conn):
            conn.invalidate()  # never back into the pool
        conn.close()
    except Exception:  # it may be in any state after an error; the pool forgets it
        with contextlib.suppress(Exception):
            conn.invalidate()
