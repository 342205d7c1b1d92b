"""The operator side against a real PostgreSQL: job operations, stats, purge, health, registry.

Job states are manufactured with direct inserts and updates (tests/job_states.py); every test
asserts the rows or the returned figures, never log text.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from psycopg import sql
from sqlalchemy import event, func, select, update
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session, scoped_session, sessionmaker

from sa_jobqueue import InvalidJobError, JobQueue
from sa_jobqueue._sql.claiming import claim
from sa_jobqueue._sql.enqueue import CHANNEL
from sa_jobqueue._sql.transitions import complete
from sa_jobqueue.database import create_engine
from sa_jobqueue.models import SCHEMA_REVISION, jobs_table, workers_table
from sa_jobqueue.ops.health import Finding, Thresholds, check, worst
from sa_jobqueue.ops.jobs import (
    count_purge,
    expire_workers,
    purge,
    register_worker,
    stats,
    touch_worker,
    unregister_worker,
)
from tests.helpers.job_states import ERROR, add_dead, add_job, add_worker, ago
from tests.helpers.jobs import row, status_by_id
from tests.helpers.waiting import wait_for

j = jobs_table.c
w = workers_table.c


@pytest.fixture
def queue() -> JobQueue:
    return JobQueue()


# -- requeue ---------------------------------------------------------------------------------


def test_requeue_extend_keeps_attempts_and_raises_the_limit(
    engine: sa.Engine, queue: JobQueue
) -> None:
    with engine.begin() as conn:
        job_id = add_dead(conn, attempts=3, max_attempts=3, finished_ago=60)
    with engine.begin() as conn:
        assert queue.requeue(conn, job_id) is True
    job = row(engine, job_id)
    assert (job.status, job.attempts, job.max_attempts) == ("queued", 3, 6)
    assert job.finished_at is None
    assert job.worker is None
    assert job.last_error == ERROR  # kept: why it died is still there to see
    with engine.connect() as conn:
        assert conn.execute(select(j.visible_at <= func.now()).where(j.id == job_id)).scalar()


def test_requeue_reset_counts_attempts_from_zero(engine: sa.Engine, queue: JobQueue) -> None:
    with engine.begin() as conn:
        job_id = add_dead(conn, attempts=3, max_attempts=3)
    with engine.begin() as conn:
        assert queue.requeue(conn, job_id, attempts="reset") is True
    job = row(engine, job_id)
    assert (job.status, job.attempts, job.max_attempts) == ("queued", 0, 3)
    assert job.finished_at is None


def test_extended_job_is_claimed_with_a_new_attempt_number_that_fences_the_old_one(
    engine: sa.Engine, queue: JobQueue
) -> None:
    """After "extend" an attempt from before the requeue cannot complete the new one."""
    with engine.begin() as conn:
        job_id = add_dead(conn, attempts=2, max_attempts=2)
        queue.requeue(conn, job_id)
    with engine.begin() as conn:
        claimed = conn.execute(claim(), {"from_queue": "default", "limit": 5, "worker": "w"})
        assert [(r.id, r.status, r.attempts) for r in claimed] == [(job_id, "running", 3)]
    with engine.begin() as conn:
        stale = conn.execute(complete(), {"job_id": job_id, "attempt": 2})
        assert stale.rowcount == 0
        current = conn.execute(complete(), {"job_id": job_id, "attempt": 3})
        assert current.rowcount == 1
    assert row(engine, job_id).status == "succeeded"


@pytest.mark.parametrize("status", ["queued", "running", "succeeded", "cancelled"])
def test_requeue_leaves_a_job_that_is_not_dead_alone(
    engine: sa.Engine, queue: JobQueue, status: str
) -> None:
    with engine.begin() as conn:
        job_id = add_job(conn, status=status, attempts=1, started_ago=5)
    before = row(engine, job_id)
    with engine.begin() as conn:
        assert queue.requeue(conn, job_id) is False
        assert queue.requeue(conn, job_id, attempts="reset") is False
    assert row(engine, job_id) == before


def test_requeue_of_a_missing_job_is_false(engine: sa.Engine, queue: JobQueue) -> None:
    with engine.begin() as conn:
        assert queue.requeue(conn, 123456) is False


def test_requeue_refuses_when_a_live_job_holds_the_unique_key(
    engine: sa.Engine, queue: JobQueue
) -> None:
    with engine.begin() as conn:
        dead = add_dead(conn, unique_key="order-7")
        add_job(conn, unique_key="order-7")  # the same task's key, queued again meanwhile
        other_task = add_dead(conn, task="other", unique_key="order-7")
    with engine.begin() as conn:
        assert queue.requeue(conn, dead) is False
        # The transaction is still usable: no unique violation was raised.
        assert queue.requeue(conn, other_task) is True
    assert row(engine, dead).status == "dead"
    assert row(engine, other_task).status == "queued"


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


@pytest.fixture
def listener(engine: sa.Engine) -> Iterator[psycopg.Connection[Any]]:
    _, params = engine.dialect.create_connect_args(engine.url)
    params.pop("context", None)
    with psycopg.connect(**params, autocommit=True) as conn:
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
        yield conn


def test_requeue_wakes_the_queue_once_at_commit(
    engine: sa.Engine, queue: JobQueue, listener: psycopg.Connection[Any]
) -> None:
    with engine.begin() as conn:
        first = add_dead(conn, queue="mail")
        second = add_dead(conn, queue="mail")
    with engine.begin() as conn:
        assert queue.requeue(conn, first)
        assert queue.requeue(conn, second)
        conn.execute(select(func.pg_notify(CHANNEL, "~marker")))
    received = []
    for notify in listener.notifies(timeout=10):
        if notify.payload == "~marker":
            break
        received.append(notify.payload)
    assert received == ["mail"]


def test_requeue_rejects_an_unknown_mode(engine: sa.Engine, queue: JobQueue) -> None:
    with engine.begin() as conn:
        job_id = add_dead(conn)
        with pytest.raises(InvalidJobError, match="extend"):
            queue.requeue(conn, job_id, attempts="again")  # type: ignore[arg-type]
    assert row(engine, job_id).status == "dead"


# -- list_jobs -------------------------------------------------------------------------------


def test_list_jobs_filters_and_pages_by_id(engine: sa.Engine, queue: JobQueue) -> None:
    with engine.begin() as conn:
        mail_dead = [add_dead(conn, queue="mail", task="send") for _ in range(5)]
        add_dead(conn, queue="mail", task="bounce")
        add_dead(conn, queue="other", task="send")
        add_job(conn, queue="mail", task="send")

    with engine.connect() as conn:
        everything = queue.list_jobs(conn)
        assert [job.id for job in everything] == sorted(job.id for job in everything)
        assert len(everything) == 8
        first = queue.list_jobs(conn, queue="mail", task="send", status="dead", limit=2)
        assert [job.id for job in first] == mail_dead[:2]
        rest = queue.list_jobs(
            conn, queue="mail", task="send", status="dead", limit=10, after_id=first[-1].id
        )
        assert [job.id for job in rest] == mail_dead[2:]
        assert {job.status for job in queue.list_jobs(conn, status=["queued", "dead"])} == {
            "queued",
            "dead",
        }
        assert len(queue.list_jobs(conn, status=("queued",))) == 1
        assert rest[0].last_error == ERROR


def test_list_jobs_older_than_uses_the_creation_time(engine: sa.Engine, queue: JobQueue) -> None:
    with engine.begin() as conn:
        old = add_job(conn, created_ago=7200)
        add_job(conn, created_ago=60)
    with engine.connect() as conn:
        found = queue.list_jobs(conn, older_than=timedelta(hours=1))
    assert [job.id for job in found] == [old]


@pytest.mark.parametrize(
    "bad",
    [
        {"status": "exploded"},
        {"status": []},
        {"limit": 0},
        {"limit": 10_001},
        {"queue": "no spaces"},
        {"task": "9starts-with-a-digit"},
        {"older_than": timedelta(seconds=-1)},
        {"after_id": "12"},
    ],
)
def test_list_jobs_refuses_bad_filters_before_sending_sql(
    engine: sa.Engine, queue: JobQueue, bad: dict[str, Any]
) -> None:
    sent: list[str] = []
    with engine.connect() as conn:
        event.listen(conn, "before_cursor_execute", lambda *a: sent.append(a[2]))
        with pytest.raises(InvalidJobError):
            queue.list_jobs(conn, **bad)
    assert sent == []


# -- stats -----------------------------------------------------------------------------------


def test_stats_counts_ages_outcomes_and_workers(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        add_job(conn, queue="mail", visible_in=-90)  # due for 90 s
        add_job(conn, queue="mail", visible_in=-10)
        add_job(conn, queue="mail", visible_in=3600)  # scheduled: queued but not due
        add_job(conn, queue="mail", status="running", attempts=1, started_ago=5, visible_in=25)
        add_job(conn, queue="mail", status="succeeded", attempts=1, started_ago=3, finished_ago=2)
        add_job(conn, queue="mail", status="succeeded", started_ago=7300, finished_ago=7200)
        add_dead(conn, queue="reports", finished_ago=30)
        add_job(conn, queue="reports", status="cancelled", finished_ago=10)
        add_worker(conn, "live-1", seen_ago=5)
        add_worker(conn, "gone-1", seen_ago=600)

    with engine.connect() as conn:
        result = stats(conn, window=timedelta(minutes=10), stale_after=timedelta(minutes=1))

    mail, reports = result.queues
    assert mail.queue == "mail"
    assert mail.counts == {"queued": 3, "running": 1, "succeeded": 2, "dead": 0, "cancelled": 0}
    assert mail.due == 2
    assert mail.oldest_due_age is not None
    assert timedelta(seconds=90) <= mail.oldest_due_age < timedelta(seconds=120)
    assert mail.finished == {"succeeded": 1, "dead": 0, "cancelled": 0}  # 2 h ago: outside
    assert reports.counts["dead"] == 1
    assert (reports.due, reports.oldest_due_age) == (0, None)
    assert reports.finished == {"succeeded": 0, "dead": 1, "cancelled": 1}
    assert [worker.name for worker in result.workers] == ["live-1"]
    assert result.workers[0].queues == ["default"]
    assert result.window == timedelta(minutes=10)


def test_stats_run_time_percentiles_per_task(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        for seconds in range(1, 101):  # run times of 1..100 s, all finished 100-199 s ago
            add_job(
                conn,
                task="resize",
                status="succeeded",
                attempts=1,
                started_ago=200,
                finished_ago=200 - seconds,
            )
        # Outside the window: its 10,000 s must not count.
        add_job(conn, task="resize", status="succeeded", started_ago=17200, finished_ago=7200)
        add_dead(conn, task="fragile", started_ago=4, finished_ago=2)
        add_job(conn, task="never_ran", status="cancelled", finished_ago=1)

    with engine.connect() as conn:
        tasks = {t.task: t for t in stats(conn, window=timedelta(minutes=10)).tasks}

    assert set(tasks) == {"fragile", "resize"}
    resize = tasks["resize"]
    assert resize.jobs == 100
    # percentile_cont interpolates: p50 of 1..100 is 50.5, p99 is 99 + 0.01 * (100 - 99).
    assert resize.p50.total_seconds() == pytest.approx(50.5)
    assert resize.p99.total_seconds() == pytest.approx(99.01)
    assert tasks["fragile"].p50.total_seconds() == pytest.approx(2)


def test_stats_of_an_empty_queue(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        result = stats(conn)
    assert (result.queues, result.tasks, result.workers) == ([], [], [])


# -- purge -----------------------------------------------------------------------------------


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


# -- check -----------------------------------------------------------------------------------


def findings(engine: sa.Engine, **thresholds: Any) -> dict[str, Finding]:
    with engine.connect() as conn:
        return {f.check: f for f in check(conn, Thresholds(**thresholds))}


ALL_CHECKS = [
    "schema",
    "workers",
    "backlog",
    "leases",
    "dead_jobs",
    "vacuum",
    "transactions",
    "replication_slots",
]


def test_check_all_ok_with_a_live_worker(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        add_worker(conn, "w1")
        add_job(conn)  # due now: no wait to speak of
    found = findings(engine)
    assert list(found) == ALL_CHECKS
    assert {f.severity for f in found.values()} == {"ok"}, found
    assert SCHEMA_REVISION in found["schema"].message
    assert worst(found.values()) == "ok"


def test_check_without_live_workers(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        add_worker(conn, "stale", seen_ago=300)
    assert findings(engine)["workers"].severity == "warning"  # nothing is due
    with engine.begin() as conn:
        add_job(conn)
    found = findings(engine)
    assert found["workers"].severity == "critical"
    assert found["workers"].action
    assert worst(found.values()) == "critical"
    with engine.begin() as conn:
        add_worker(conn, "fresh")
    assert findings(engine)["workers"].severity == "ok"


def test_check_backlog_waiting_too_long(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        add_worker(conn, "w1")
        add_job(conn, queue="slow", visible_in=-600)
        add_job(conn, queue="fine", visible_in=-10)
        add_job(conn, queue="later", visible_in=-3600 + 7200)  # due in an hour
    backlog = findings(engine, max_wait=timedelta(minutes=5))["backlog"]
    assert backlog.severity == "warning"
    assert "slow" in backlog.message
    assert "fine" not in backlog.message
    assert backlog.value is not None
    assert 600 <= backlog.value < 660
    assert findings(engine, max_wait=timedelta(minutes=15))["backlog"].severity == "ok"


def test_check_expired_leases(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        add_worker(conn, "w1")
        job_id = add_job(conn, status="running", attempts=1, started_ago=60, visible_in=20)
    assert findings(engine, lease_grace=timedelta(0))["leases"].severity == "ok"
    with engine.begin() as conn:  # the worker stopped renewing: the lease ran out 2 min ago
        conn.execute(update(jobs_table).where(j.id == job_id).values(visible_at=ago(120)))
    leases = findings(engine, lease_grace=timedelta(minutes=1))["leases"]
    assert (leases.severity, leases.value) == ("warning", 1)
    assert findings(engine, lease_grace=timedelta(minutes=5))["leases"].severity == "ok"


def test_check_recent_dead_jobs(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        add_worker(conn, "w1")
        add_dead(conn, finished_ago=7200)
    assert findings(engine, dead_window=timedelta(hours=1))["dead_jobs"].severity == "ok"
    with engine.begin() as conn:
        add_dead(conn, finished_ago=60)
        add_dead(conn, finished_ago=60)
    dead = findings(engine, dead_window=timedelta(hours=1))["dead_jobs"]
    assert (dead.severity, dead.value) == ("warning", 2)
    assert findings(engine, max_dead=2)["dead_jobs"].severity == "ok"


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


def test_check_an_outdated_schema(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE sa_jobqueue_alembic_version SET version_num = 'sajq_0001'")
    schema = findings(engine)["schema"]
    assert schema.severity == "critical"
    assert "sajq_0001" in schema.message


# -- the worker registry ---------------------------------------------------------------------


def workers(engine: sa.Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        return {r.name: r for r in conn.execute(select(workers_table))}


def test_register_touch_unregister(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        register_worker(conn, "h:1:a", "h", 1, ["default", "mail"], 8)
    (first,) = workers(engine).values()
    assert (first.host, first.pid, first.queues, first.concurrency) == (
        "h",
        1,
        ["default", "mail"],
        8,
    )
    with engine.begin() as conn:  # a restart under the same name replaces the row
        register_worker(conn, "h:1:a", "h2", 2, ["mail"], 2)
    again = workers(engine)["h:1:a"]
    assert (again.host, again.pid, again.queues, again.concurrency) == ("h2", 2, ["mail"], 2)

    with engine.begin() as conn:
        conn.execute(update(workers_table).values(last_seen_at=ago(3600)))
    with engine.begin() as conn:
        assert touch_worker(conn, "h:1:a") is True
        fresh = conn.execute(select(func.now() - w.last_seen_at)).scalar_one()
    assert fresh < timedelta(seconds=5)

    with engine.begin() as conn:
        assert unregister_worker(conn, "h:1:a") is True
        assert unregister_worker(conn, "h:1:a") is False
        assert touch_worker(conn, "h:1:a") is False  # gone: the worker should register again
    assert workers(engine) == {}


def test_expire_workers_removes_only_stale_rows(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        add_worker(conn, "fresh", seen_ago=10)
        add_worker(conn, "stale", seen_ago=600)
    with engine.begin() as conn:
        assert expire_workers(conn, timedelta(minutes=5)) == ["stale"]
        assert expire_workers(conn, timedelta(minutes=5)) == []
    assert set(workers(engine)) == {"fresh"}
