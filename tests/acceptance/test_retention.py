"""Retention: finished jobs are pruned in bounded batches, by one worker at a time."""

from __future__ import annotations

from datetime import timedelta

import sqlalchemy as sa
from sqlalchemy.orm import Session

from sa_jobqueue import JobContext, JobQueue, Worker
from sa_jobqueue._sql import retention
from sa_jobqueue.models import Job
from sa_jobqueue.worker import PRUNE_BATCH
from tests.helpers.jobs import burst, statuses
from tests.helpers.waiting import running, wait_for


def outcome_queue() -> JobQueue:
    queue = JobQueue()

    @queue.task(max_attempts=1)
    def outcome(ctx: JobContext, payload: str) -> None:
        if payload == "fail":
            raise RuntimeError("dead on purpose")

    return queue


def age_finished(engine: sa.Engine, by: timedelta) -> None:
    """Pretend every finished job finished ``by`` earlier (database clock)."""
    with engine.begin() as conn:
        conn.execute(
            sa.update(Job)
            .where(Job.finished_at.is_not(None))
            .values(finished_at=Job.finished_at - by)
        )


def test_old_succeeded_and_cancelled_jobs_are_pruned_and_the_rest_stay(db: sa.Engine) -> None:
    queue = outcome_queue()
    with Session(db) as session, session.begin():
        queue.enqueue_many(session, "outcome", ["ok"] * 3 + ["fail"] * 2)
        doomed = queue.enqueue(session, "outcome", "ok", run_at=timedelta(hours=1))
        queue.cancel(session, doomed)
    burst(queue, db)
    age_finished(db, timedelta(hours=2))
    with Session(db) as session, session.begin():
        queue.enqueue(session, "outcome", "ok")  # finishes now: recent
        queue.enqueue(session, "outcome", "later", run_at=timedelta(hours=1))  # still queued
    worker = Worker(queue, db, listen=False, retention=timedelta(hours=1))
    worker.run(burst=True)
    assert worker.prune() == 0  # what was old is gone already: run() pruned on its way
    assert statuses(db) == {"succeeded": 1, "dead": 2, "queued": 1}


def test_pruning_works_in_bounded_batches(db: sa.Engine) -> None:
    queue = outcome_queue()
    with Session(db) as session, session.begin():
        queue.enqueue_many(session, "outcome", ["ok"] * (PRUNE_BATCH * 2 + 500))
    burst(queue, db, concurrency=8)
    age_finished(db, timedelta(days=2))
    worker = Worker(queue, db, listen=False)  # default retention: one day
    assert worker.prune(max_batches=1) == PRUNE_BATCH
    assert worker.prune() == PRUNE_BATCH + 500
    assert statuses(db) == {}


def test_only_one_session_prunes_at_a_time(db: sa.Engine) -> None:
    queue = outcome_queue()
    with Session(db) as session, session.begin():
        queue.enqueue_many(session, "outcome", ["ok"] * 5)
    burst(queue, db)
    age_finished(db, timedelta(days=2))
    worker = Worker(queue, db, listen=False)
    with db.connect() as holder:  # another worker, in the middle of pruning
        holder.execute(sa.select(sa.func.pg_advisory_lock(retention.PRUNE_LOCK)))
        assert worker.prune() == 0
        holder.execute(sa.select(sa.func.pg_advisory_unlock(retention.PRUNE_LOCK)))
    assert worker.prune() == 5


def test_retention_none_keeps_everything(db: sa.Engine) -> None:
    queue = outcome_queue()
    with Session(db) as session, session.begin():
        queue.enqueue_many(session, "outcome", ["ok"] * 3)
    burst(queue, db)
    age_finished(db, timedelta(days=3650))
    assert Worker(queue, db, listen=False, retention=None).prune() == 0
    assert statuses(db) == {"succeeded": 3}


def test_zero_retention_deletes_finished_jobs_at_the_next_poll(db: sa.Engine) -> None:
    queue = outcome_queue()
    worker = Worker(
        queue, db, listen=False, retention=timedelta(0), poll_interval=timedelta(seconds=0.1)
    )
    with running(worker):
        with Session(db) as session, session.begin():
            queue.enqueue_many(session, "outcome", ["ok", "ok", "fail"])
        wait_for(lambda: statuses(db) == {"dead": 1}, timeout=10)


def test_the_migration_sets_storage_parameters_for_a_churning_table(db: sa.Engine) -> None:
    with db.connect() as conn:
        options = conn.execute(
            sa.text("SELECT reloptions FROM pg_class WHERE relname = 'sa_jobqueue_jobs'")
        ).scalar_one()
    assert set(options) == {
        "fillfactor=70",
        "autovacuum_vacuum_scale_factor=0.02",
        "autovacuum_vacuum_insert_scale_factor=0.02",
        "autovacuum_analyze_scale_factor=0.02",
    }
