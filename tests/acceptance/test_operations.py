"""The operator side where it needs commits, other connections or NOTIFY.

Requeue as part of the caller's transaction and its wake-up at commit, purge (which commits batch
by batch), and the health checks that look at other sessions, VACUUM or another database.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy import event, func, select
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session, scoped_session, sessionmaker

from sa_jobqueue import InvalidJobError, JobQueue
from sa_jobqueue.database import create_engine
from sa_jobqueue.models import jobs_table
from sa_jobqueue.ops import Finding, check, count_purge, purge, requeue_dead_jobs, worst
from tests.helpers.job_states import add_dead, add_job, add_worker
from tests.helpers.jobs import findings, row, status_by_id
from tests.helpers.notify import notifications
from tests.helpers.waiting import wait_for

j = jobs_table.c


def _session(engine: sa.Engine) -> Session:
    return Session(engine)


def _scoped(engine: sa.Engine) -> Any:
    return scoped_session(sessionmaker(engine))


def _connection(engine: sa.Engine) -> sa.Connection:
    return engine.connect()


@pytest.mark.parametrize(
    "make", [_session, _scoped, _connection], ids=["session", "scoped", "conn"]
)
def test_requeue_is_part_of_the_callers_transaction(
    engine: sa.Engine, queue: JobQueue, make: Callable[[sa.Engine], Any]
) -> None:
    with engine.begin() as conn:
        job_id = add_dead(conn)
    handle = make(engine)
    try:
        assert queue.requeue(handle, job_id) is True
        assert queue.get_job(handle, job_id).status == "queued"  # type: ignore[union-attr]
        assert row(engine, job_id).status == "dead"  # not committed: others see it dead
        handle.rollback()
        assert row(engine, job_id).status == "dead"
        assert queue.requeue(handle, job_id) is True
        handle.commit()
    finally:
        handle.close()
    assert row(engine, job_id).status == "queued"


def test_requeue_wakes_the_queue_once_at_commit(
    engine: sa.Engine, queue: JobQueue, listener: psycopg.Connection[Any]
) -> None:
    with engine.begin() as conn:
        first = add_dead(conn, queue="mail")
        second = add_dead(conn, queue="mail")
    with engine.begin() as conn:
        assert queue.requeue(conn, first)
        assert queue.requeue(conn, second)
    assert notifications(listener, engine) == ["mail"]


def test_requeue_dead_jobs_wakes_each_queue_once_at_commit(
    engine: sa.Engine, listener: psycopg.Connection[Any]
) -> None:
    with engine.begin() as conn:
        for name in ("mail", "mail", "sms"):
            add_dead(conn, queue=name)
    with engine.begin() as conn:
        done = requeue_dead_jobs(conn)
        assert (done.requeued, done.kept) == (3, 0)
    assert sorted(notifications(listener, engine)) == ["mail", "sms"]


def test_requeue_dead_jobs_passes_over_rows_locked_by_someone_else(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        locked, free = add_dead(conn), add_dead(conn)
    with engine.connect() as holder, holder.begin():
        holder.execute(select(j.id).where(j.id == locked).with_for_update())
        with engine.begin() as conn:
            # Waiting for the lock would fail here instead of hanging the test.
            conn.execute(sa.text("SET LOCAL lock_timeout = '5s'"))
            done = requeue_dead_jobs(conn)
        assert (done.requeued, done.kept, done.last_id, done.more) == (1, 0, free, False)
    assert status_by_id(engine) == {locked: "dead", free: "queued"}


def test_purge_deletes_only_the_matching_finished_jobs(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        old_dead = [add_dead(conn, finished_ago=8 * 86400) for _ in range(3)]
        recent_dead = add_dead(conn, finished_ago=3600)
        old_succeeded = add_job(conn, status="succeeded", finished_ago=8 * 86400)
        other_queue = add_dead(conn, queue="keep", finished_ago=8 * 86400)
        other_task = add_dead(conn, task="keep", finished_ago=8 * 86400)
        queued = add_job(conn, created_ago=8 * 86400)
        running = add_job(conn, status="running", attempts=1, created_ago=8 * 86400)

    selection = (["dead"], timedelta(days=7), "default", "work")
    with engine.connect() as conn:
        assert count_purge(conn, *selection) == 3
    with engine.connect() as conn:
        assert purge(conn, *selection) == 3

    left = status_by_id(engine)
    assert not set(old_dead) & set(left)
    assert set(left) == {recent_dead, old_succeeded, other_queue, other_task, queued, running}


def test_purge_commits_batch_by_batch(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        for _ in range(5):
            add_job(conn, status="succeeded", finished_ago=60)
            add_job(conn, status="cancelled", finished_ago=60)
    commits: list[int] = []
    with engine.connect() as conn:
        event.listen(conn, "commit", lambda c: commits.append(1))
        deleted = purge(conn, ["succeeded", "cancelled"], timedelta(0), batch=3)
    assert deleted == 10
    assert len(commits) == 4  # 3 + 3 + 3 + 1
    assert status_by_id(engine) == {}


def test_purge_skips_rows_locked_by_someone_else(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        locked, free = add_dead(conn), add_dead(conn)
    with engine.connect() as holder, holder.begin():
        holder.execute(select(j.id).where(j.id == locked).with_for_update())
        with engine.connect() as conn:
            assert purge(conn, ["dead"], timedelta(0)) == 1
    assert set(status_by_id(engine)) == {locked}
    assert free not in status_by_id(engine)


@pytest.mark.parametrize("live", ["queued", "running"])
def test_purge_refuses_live_statuses(engine: sa.Engine, live: str) -> None:
    with engine.begin() as conn:
        job_id = add_job(conn, status=live, created_ago=86400)
    with engine.connect() as conn, pytest.raises(InvalidJobError, match="refusing"):
        purge(conn, ["dead", live], timedelta(0))
    assert job_id in status_by_id(engine)


def test_purge_needs_a_connection_outside_a_transaction(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        job_id = add_dead(conn)
    with engine.connect() as conn:
        conn.execute(select(1))  # autobegins
        with pytest.raises(InvalidJobError, match="no transaction"):
            purge(conn, ["dead"], timedelta(0))
    assert job_id in status_by_id(engine)


def test_check_dead_tuples(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        add_worker(conn, "w1")
        for _ in range(20):
            add_job(conn, status="succeeded")
    with engine.connect() as conn:
        conn.execute(sa.delete(jobs_table))
        conn.commit()
        # Statistics reach the server's shared memory when this backend next goes idle.
        conn.execute(select(func.pg_stat_force_next_flush()))
        conn.commit()

    def vacuum() -> Finding | None:
        found = findings(engine, max_dead_tuples=10)["vacuum"]
        return found if found.severity == "warning" else None

    warned = wait_for(vacuum, timeout=15)
    assert warned.value is not None
    assert warned.value >= 20
    assert "VACUUM" in warned.action
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM sa_jobqueue_jobs")
    wait_for(lambda: findings(engine, max_dead_tuples=10)["vacuum"].severity == "ok", timeout=15)


def test_check_a_transaction_holding_the_horizon(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        add_worker(conn, "w1")
    assert findings(engine, max_transaction_age=timedelta(0))["transactions"].severity == "ok"
    with engine.connect() as holder:
        holder.execution_options(isolation_level="REPEATABLE READ")
        holder.execute(select(func.count()).select_from(jobs_table))  # takes the snapshot
        pid = holder.execute(select(func.pg_backend_pid())).scalar_one()
        found = findings(engine, max_transaction_age=timedelta(0))["transactions"]
        assert found.severity == "warning"
        assert f"pid {pid}" in found.message
        assert f"pg_terminate_backend({pid})" in found.action
        assert findings(engine)["transactions"].severity == "ok"  # well under 5 minutes
        holder.rollback()
    assert findings(engine, max_transaction_age=timedelta(0))["transactions"].severity == "ok"


def test_check_a_transaction_of_another_database_does_not_count(
    engine: sa.Engine, empty_database_url: URL
) -> None:
    """Since PostgreSQL 14 only this database's sessions hold its tables' horizon."""
    other = create_engine(empty_database_url, poolclass=sa.pool.NullPool)
    try:
        with other.connect() as holder:
            holder.execution_options(isolation_level="REPEATABLE READ")
            holder.execute(select(1))
            found = findings(engine, max_transaction_age=timedelta(0))["transactions"]
            assert found.severity == "ok"
    finally:
        other.dispose()


def test_check_a_logical_slot_holding_the_catalog_horizon(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        if conn.exec_driver_sql("SHOW wal_level").scalar() != "logical":
            pytest.skip("needs wal_level = logical")
        # A temporary slot disappears with its session, even if the test fails.
        conn.exec_driver_sql(
            "SELECT pg_create_logical_replication_slot('sajq_test_slot', 'test_decoding', true)"
        )
        conn.commit()
        with engine.begin() as writer:  # age the slot's catalog_xmin by a transaction or two
            add_job(writer)
        slots = findings(engine, max_xmin_age=0)["replication_slots"]
        assert slots.severity == "warning"
        assert "sajq_test_slot" in slots.message
        assert findings(engine)["replication_slots"].severity == "ok"


def test_check_a_database_without_the_schema(empty_database_url: URL) -> None:
    engine = create_engine(empty_database_url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            found = check(conn)
    finally:
        engine.dispose()
    assert [f.check for f in found] == ["schema", "transactions", "replication_slots"]
    assert found[0].severity == "critical"
    assert "sa-jobqueue migrate" in found[0].action
    assert worst(found) == "critical"
