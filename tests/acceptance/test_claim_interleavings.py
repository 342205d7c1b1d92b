"""Interleavings of claims and completions, forced one statement at a time on real connections.

The wait found at scale: a claim whose snapshot still saw a job queued reaches it just after
another worker's claim of it committed; READ COMMITTED then locks the job's newest version
(``running``, the other worker's), finds it no longer due and skips it, but keeps the lock
until the claim's transaction ends. The other worker's completion of that job, a moment
later, came to wait on a stranger's claim. The limited claim makes the interleaving easy to
force: it locks its queue's settings row after its snapshot is taken, so a test that holds
that row makes the claim wait between its snapshot and its scan of the jobs.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from sa_jobqueue import JobContext, JobQueue, Worker
from sa_jobqueue._sql import claim_limits, transitions
from sa_jobqueue._sql.fence import held_many
from sa_jobqueue.models import Job, QueueSettings
from tests.helpers.observers import Outcomes
from tests.helpers.waiting import running, wait_for

queue = JobQueue()
#: Set by the test: the ``held`` task's handler returns once it is.
release = threading.Event()


@queue.task(queue="capped")
def noop(ctx: object, payload: object) -> None:
    pass


@queue.task(queue="plain")
def held(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Returns at once, or, with ``{"hold": true}``, once the test sets ``release``."""
    if payload.get("hold"):
        assert release.wait(30)


def _statuses(engine: sa.Engine) -> dict[int, str]:
    with Session(engine) as session:
        return {job.id: job.status for job in session.scalars(sa.select(Job))}


def _claim_by_another_worker(engine: sa.Engine, job_id: int) -> int:
    """What a worker's claim does to a job, committed: running, its attempt counted."""
    with engine.begin() as conn:
        return conn.execute(
            sa.update(Job)
            .where(Job.id == job_id)
            .values(
                status="running",
                attempts=Job.attempts + 1,
                worker="other",
                started_at=sa.func.now(),
                visible_at=sa.func.now() + timedelta(seconds=30),
            )
            .returning(Job.attempts)
        ).scalar_one()


def _waiting_for_lock(engine: sa.Engine, pid: int) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                sa.text("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = :p"),
                {"p": pid},
            ).scalar()
        )


def test_a_claim_that_skips_a_job_another_claim_took_never_makes_its_completion_wait(
    db: sa.Engine,
) -> None:
    with Session(db) as session, session.begin():
        (job_id,) = queue.enqueue_many(session, "noop", [{}])
        session.add(QueueSettings(queue="capped", concurrency=10))

    with db.connect() as holder, db.connect() as claimer:
        # 1. The queue's row held, the limited claim starts: its snapshot sees the job queued.
        holder.begin()
        holder.execute(sa.select(QueueSettings).with_for_update())
        # (Its transaction, begun here, stays open until the test commits it.)
        claimer_pid = claimer.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
        claimed: list[list[sa.Row[object]]] = []
        claiming = threading.Thread(
            target=lambda: claimed.append(
                list(
                    claimer.execute(
                        claim_limits.claim_limited(keyed=False),
                        {"from_queue": "capped", "limit": 10, "worker": "stranger"},
                    )
                )
            )
        )
        claiming.start()
        wait_for(lambda: _waiting_for_lock(db, claimer_pid), timeout=10)
        # 2. Meanwhile another worker claims the job, and commits.
        attempt = _claim_by_another_worker(db, job_id)
        # 3. The claim goes on: it reaches the job, finds it taken, skips it.
        holder.rollback()
        claiming.join(10)
        assert [row.id for row in claimed[0] if row.id is not None] == []
        # ... and holds a lock on it until its transaction ends (the cause).
        with db.connect() as probe:
            probe.execute(sa.text("SET lock_timeout = '100ms'"))
            with pytest.raises(OperationalError, match="lock"):
                probe.execute(sa.select(Job.id).where(Job.id == job_id).with_for_update())

        # 4. The plain batched completion waits for it (what the worker sent before) ...
        fence = {**held_many([(job_id, attempt)]), "results": "{}"}
        with db.connect() as completer:
            completer.execute(sa.text("SET lock_timeout = '100ms'"))
            with pytest.raises(OperationalError, match="lock"):
                completer.execute(transitions.complete_many(), fence)
        # ... the worker's does not: the job comes back busy, to be tried again.
        with db.connect() as completer:
            completer.execute(sa.text("SET lock_timeout = '2s'"))
            row = completer.execute(transitions.complete_many_unless_locked(), fence).one()
            completer.commit()
        assert (row.done, row.locked) == ([], [])

        # 5. Once the stranger's claim ends, the completion goes through.
        claimer.commit()
    with db.connect() as completer:
        row = completer.execute(transitions.complete_many_unless_locked(), fence).one()
        completer.commit()
    assert (row.done, row.locked) == ([job_id], [job_id])
    with Session(db) as session:
        assert session.get_one(Job, job_id).status == "succeeded"


def test_a_worker_completes_around_a_row_another_transaction_holds(db: sa.Engine) -> None:
    """The worker's batched completion of a job whose row another transaction holds locked
    (a claim that skipped it, here a test's ``FOR UPDATE``) waits for nothing: the jobs after
    it succeed meanwhile, and it succeeds, reported once, as soon as the lock is gone."""
    release.clear()
    with Session(db) as session, session.begin():
        (blocked,) = queue.enqueue_many(session, "held", [{"hold": True}])
    outcomes = Outcomes()
    worker = Worker(queue, db, queues=["plain"], concurrency=4, observers=[outcomes])
    with running(worker), db.connect() as holder:
        wait_for(lambda: _statuses(db)[blocked] == "running", timeout=20)
        # Its handler is still running: lock its row, then let the handler return.
        holder.execute(sa.select(Job.id).where(Job.id == blocked).with_for_update())
        release.set()
        with Session(db) as session, session.begin():
            later = queue.enqueue_many(session, "held", [{} for _ in range(5)])
        wait_for(lambda: all(_statuses(db)[i] == "succeeded" for i in later), timeout=20)
        assert _statuses(db)[blocked] == "running"  # its completion is tried again meanwhile
        holder.rollback()
        wait_for(lambda: _statuses(db)[blocked] == "succeeded", timeout=20)
    assert outcomes.seen.count((blocked, "succeeded")) == 1
    assert not [seen for seen in outcomes.seen if seen[0] == blocked and seen[1] != "succeeded"]


def _claim_keyed(conn: sa.Connection) -> list[int]:
    rows = conn.execute(
        claim_limits.claim_limited(keyed=True),
        {"from_queue": "capped", "limit": 10, "worker": "w"},
    )
    return [row.id for row in rows if row.id is not None]


@pytest.mark.parametrize("meanwhile", ["claimed", "completed"])
def test_a_keyed_claim_that_waited_for_the_lock_counts_the_keys_holders_as_they_are_after_it(
    db: sa.Engine, meanwhile: str
) -> None:
    """A claim's head of the queue comes from its snapshot, taken before it waited for the
    queue's row; the key's holders from after the wait. Whatever moved meanwhile, a key's
    later job is taken only once the earlier one holds no slot because it ended: taken by the
    claim it waited for, the earlier job (still queued in the head) holds its key; ended, it
    is no longer in the way."""
    with Session(db) as session, session.begin():
        first, second = queue.enqueue_many(session, "noop", [{"customer": "c0"}] * 2)
        session.add(QueueSettings(queue="capped", key_concurrency=1, key_field="customer"))
    with db.connect() as other, db.connect() as claimer:
        other.begin()
        if meanwhile == "claimed":
            # 1. Another claim takes the first job and holds the queue's row until it commits.
            assert _claim_keyed(other) == [first]
        else:
            # 1. The first job was claimed and runs; the queue's row is held.
            with db.begin() as conn:
                assert _claim_keyed(conn) == [first]
            other.execute(sa.select(QueueSettings).with_for_update())
        # 2. The claim starts: its snapshot sees the first job queued (or running).
        claimer_pid = claimer.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
        claimer.commit()
        took: list[list[int]] = []
        claiming = threading.Thread(target=lambda: took.append(_claim_keyed(claimer)))
        claiming.start()
        wait_for(lambda: _waiting_for_lock(db, claimer_pid), timeout=10)
        if meanwhile == "completed":
            # 3. The first job completes while the claim waits.
            with db.begin() as conn:
                fence = held_many([(first, 1)])
                assert [r.id for r in conn.execute(transitions.complete_many(), fence)] == [first]
        other.commit()
        claiming.join(10)
        claimer.commit()
    assert took == [[] if meanwhile == "claimed" else [second]]
