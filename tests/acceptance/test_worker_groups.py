"""Group commit without a worker: jobs' savepoints share a transaction, one commit for all."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from sa_jobqueue import JobQueue
from sa_jobqueue._sql import claiming
from sa_jobqueue.models import Job
from sa_jobqueue.observability import Observers
from sa_jobqueue.worker._claimed import Claimed
from sa_jobqueue.worker._groups import Groups, ThreadState
from sa_jobqueue.worker._lanes import Lane
from sa_jobqueue.worker._leases import LeaseTable
from sa_jobqueue.worker._recorder import Recorder
from sa_jobqueue.worker._reports import Reports
from sa_jobqueue.worker._sessions import GroupSession
from tests.helpers.observers import Outcomes

NOTES = sa.table("notes", sa.column("job_id", sa.BigInteger))


#: The table the handlers write, created by the tier's ``db`` fixture.
TABLES = "CREATE TABLE notes (job_id bigint PRIMARY KEY)"


QUEUE = JobQueue()


@QUEUE.task
def work(ctx: object, payload: object) -> None:
    pass


class Setup:
    def __init__(self, db: sa.Engine) -> None:
        self.db = db
        self.outcomes = Outcomes()
        self.recorder = Recorder(
            db.execution_options(isolation_level="AUTOCOMMIT"),
            Reports(Observers([self.outcomes])),
        )
        self.leases = LeaseTable()
        self.groups = Groups(db, self.leases, self.recorder, threading.Event())
        self.here = ThreadState(Lane(["default"], 1, 0))

    def claim(self, n: int) -> list[Claimed]:
        with Session(self.db) as session, session.begin():
            for _ in range(n):
                QUEUE.enqueue(session, "work")
        with self.db.begin() as conn:
            rows = conn.execute(
                claiming.claim(), {"from_queue": "default", "limit": n, "worker": "w"}
            ).all()
        jobs = [Claimed.of(row) for row in rows]
        for job in jobs:
            self.recorder.reports.ran(job, job.run(), 0.001)
        return jobs

    def run_in_group(self, job: Claimed) -> None:
        """What a grouped job does: its handler writes in its savepoint, which then joins
        the group as it settles."""
        ctx = job.context(lambda: self.groups.session(self.here))
        assert isinstance(ctx.session, GroupSession)
        ctx.session.execute(NOTES.insert().values(job_id=job.id))
        self.groups.settle(self.here, job, QUEUE.tasks["work"], ctx, None)

    def statuses(self) -> dict[int, str]:
        with Session(self.db) as session:
            return {job.id: job.status for job in session.scalars(sa.select(Job))}

    def attempts(self, job: Claimed) -> tuple[int, int]:
        """The job's ``attempts`` and ``max_attempts`` now."""
        with self.db.connect() as conn:
            row = conn.execute(
                sa.select(Job.attempts, Job.max_attempts).where(Job.id == job.id)
            ).one()
            return row.attempts, row.max_attempts

    def notes(self) -> list[int]:
        with self.db.connect() as conn:
            return sorted(conn.execute(sa.select(NOTES.c.job_id)).scalars())


@pytest.fixture
def setup(db: sa.Engine) -> Iterator[Setup]:
    s = Setup(db)
    yield s
    s.recorder.close()


def test_a_group_commits_its_jobs_writes_and_completions_together(setup: Setup) -> None:
    jobs = setup.claim(3)
    for job in jobs:
        setup.run_in_group(job)
    assert setup.leases.groups_open == 1
    assert setup.here.group is not None
    assert len(setup.here.group.done) == 3
    setup.groups.commit(setup.here)
    assert setup.here.group is None
    assert setup.leases.groups_open == 0
    assert set(setup.statuses().values()) == {"succeeded"}
    assert setup.notes() == sorted(job.id for job in jobs)
    assert sorted(setup.outcomes.seen) == sorted((job.id, "succeeded") for job in jobs)


def test_one_stale_job_rolls_the_group_back_and_hands_the_others_back(setup: Setup) -> None:
    stale, other = setup.claim(2)
    for job in (stale, other):
        setup.run_in_group(job)
    with setup.db.begin() as conn:  # another worker took the first job over
        conn.execute(sa.update(Job).where(Job.id == stale.id).values(attempts=stale.attempts + 1))
    setup.groups.commit(setup.here)
    assert setup.notes() == []  # nobody's writes committed
    assert setup.statuses() == {stale.id: "running", other.id: "queued"}
    assert sorted(setup.outcomes.seen) == sorted([(stale.id, "lost"), (other.id, "handed_back")])
    # Its handler ran: its attempt number is spent (the next claim must not run it again),
    # and one more attempt makes up for it, as the rollback was no fault of its own.
    assert setup.attempts(other) == (other.attempts, other.max_attempts + 1)


def test_a_group_whose_transaction_ended_early_hands_its_jobs_back(setup: Setup) -> None:
    (job,) = setup.claim(1)
    setup.run_in_group(job)
    assert setup.here.group is not None
    setup.here.group.tx.rollback()  # something ended the shared transaction
    setup.groups.commit(setup.here)
    assert setup.statuses() == {job.id: "queued"}
    assert setup.outcomes.seen == [(job.id, "handed_back")]
    assert setup.leases.groups_open == 0
    assert setup.attempts(job) == (job.attempts, job.max_attempts + 1)
