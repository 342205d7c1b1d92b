"""The operator side against a real PostgreSQL: job operations, stats, purge, health, registry.

Job states are manufactured with direct inserts and updates (tests/helpers/job_states.py); every
test asserts the rows or the returned figures, never log text. Each test runs in a transaction
that is rolled back; what needs commits or other sessions is in tests/acceptance/test_operations.py.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event, func, select, update

from sa_jobqueue import InvalidJobError, JobQueue
from sa_jobqueue._sql.claiming import claim
from sa_jobqueue._sql.transitions import complete
from sa_jobqueue.models import SCHEMA_REVISION, jobs_table, workers_table
from sa_jobqueue.ops import pause_queue, stats, worst
from sa_jobqueue.ops.health import NAMED_QUEUES
from sa_jobqueue.ops.workers import (
    expire_workers,
    register_worker,
    touch_worker,
    unregister_worker,
)
from tests.helpers.job_states import ERROR, add_dead, add_job, add_worker, ago
from tests.helpers.jobs import findings, row

j = jobs_table.c
w = workers_table.c


# -- requeue ---------------------------------------------------------------------------------


def test_requeue_extend_keeps_attempts_and_raises_the_limit(
    conn: sa.Connection, queue: JobQueue
) -> None:
    job_id = add_dead(conn, attempts=3, max_attempts=3, finished_ago=60)
    assert queue.requeue(conn, job_id) is True
    job = row(conn, job_id)
    assert (job.status, job.attempts, job.max_attempts) == ("queued", 3, 6)
    assert job.finished_at is None
    assert job.worker is None
    assert job.last_error == ERROR  # kept: why it died is still there to see
    assert conn.execute(select(j.visible_at <= func.now()).where(j.id == job_id)).scalar()


def test_requeue_reset_counts_attempts_from_zero(conn: sa.Connection, queue: JobQueue) -> None:
    job_id = add_dead(conn, attempts=3, max_attempts=3)
    assert queue.requeue(conn, job_id, attempts="reset") is True
    job = row(conn, job_id)
    assert (job.status, job.attempts, job.max_attempts) == ("queued", 0, 3)
    assert job.finished_at is None


def test_extended_job_is_claimed_with_a_new_attempt_number_that_fences_the_old_one(
    conn: sa.Connection, queue: JobQueue
) -> None:
    """After "extend" an attempt from before the requeue cannot complete the new one."""
    job_id = add_dead(conn, attempts=2, max_attempts=2)
    queue.requeue(conn, job_id)
    claimed = conn.execute(claim(), {"from_queue": "default", "limit": 5, "worker": "w"})
    assert [(r.id, r.status, r.attempts) for r in claimed] == [(job_id, "running", 3)]
    stale = conn.execute(complete(), {"job_id": job_id, "attempt": 2})
    assert stale.rowcount == 0
    current = conn.execute(complete(), {"job_id": job_id, "attempt": 3})
    assert current.rowcount == 1
    assert row(conn, job_id).status == "succeeded"


@pytest.mark.parametrize("status", ["queued", "running", "succeeded", "cancelled"])
def test_requeue_leaves_a_job_that_is_not_dead_alone(
    conn: sa.Connection, queue: JobQueue, status: str
) -> None:
    job_id = add_job(conn, status=status, attempts=1, started_ago=5)
    before = row(conn, job_id)
    assert queue.requeue(conn, job_id) is False
    assert queue.requeue(conn, job_id, attempts="reset") is False
    assert row(conn, job_id) == before


def test_requeue_of_a_missing_job_is_false(conn: sa.Connection, queue: JobQueue) -> None:
    assert queue.requeue(conn, 123456) is False


def test_requeue_refuses_when_a_live_job_holds_the_unique_key(
    conn: sa.Connection, queue: JobQueue
) -> None:
    dead = add_dead(conn, unique_key="order-7")
    add_job(conn, unique_key="order-7")  # the same task's key, queued again meanwhile
    other_task = add_dead(conn, task="other", unique_key="order-7")
    assert queue.requeue(conn, dead) is False
    # The transaction is still usable: no unique violation was raised.
    assert queue.requeue(conn, other_task) is True
    assert row(conn, dead).status == "dead"
    assert row(conn, other_task).status == "queued"


def test_requeue_rejects_an_unknown_mode(conn: sa.Connection, queue: JobQueue) -> None:
    job_id = add_dead(conn)
    with pytest.raises(InvalidJobError, match="extend"):
        queue.requeue(conn, job_id, attempts="again")  # type: ignore[arg-type]
    assert row(conn, job_id).status == "dead"


# -- list_jobs -------------------------------------------------------------------------------


def test_list_jobs_filters_and_pages_by_id(conn: sa.Connection, queue: JobQueue) -> None:
    mail_dead = [add_dead(conn, queue="mail", task="send") for _ in range(5)]
    add_dead(conn, queue="mail", task="bounce")
    add_dead(conn, queue="other", task="send")
    add_job(conn, queue="mail", task="send")

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


def test_list_jobs_older_than_uses_the_creation_time(conn: sa.Connection, queue: JobQueue) -> None:
    old = add_job(conn, created_ago=7200)
    add_job(conn, created_ago=60)
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
        {"older_than": timedelta(days=10**8)},  # now() minus it: out of the server's range
        {"after_id": "12"},
        {"after_id": 2**63},  # past the id column's bigint: the server would refuse it
    ],
)
def test_list_jobs_refuses_bad_filters_before_sending_sql(
    conn: sa.Connection, queue: JobQueue, bad: dict[str, Any]
) -> None:
    sent: list[str] = []
    event.listen(conn, "before_cursor_execute", lambda *a: sent.append(a[2]))
    with pytest.raises(InvalidJobError):
        queue.list_jobs(conn, **bad)
    assert sent == []


# -- stats -----------------------------------------------------------------------------------


def test_stats_counts_ages_outcomes_and_workers(conn: sa.Connection) -> None:
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

    result = stats(conn, window=timedelta(minutes=10), stale_after=timedelta(minutes=1))

    mail, reports = result.queues
    assert mail.queue == "mail"
    assert mail.counts == {
        "waiting": 0,
        "queued": 3,
        "running": 1,
        "succeeded": 2,
        "dead": 0,
        "cancelled": 0,
    }
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


def test_stats_run_time_percentiles_per_task(conn: sa.Connection) -> None:
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

    tasks = {t.task: t for t in stats(conn, window=timedelta(minutes=10)).tasks}

    assert set(tasks) == {"fragile", "resize"}
    resize = tasks["resize"]
    assert resize.jobs == 100
    # percentile_cont interpolates: p50 of 1..100 is 50.5, p99 is 99 + 0.01 * (100 - 99).
    assert resize.p50.total_seconds() == pytest.approx(50.5)
    assert resize.p99.total_seconds() == pytest.approx(99.01)
    assert tasks["fragile"].p50.total_seconds() == pytest.approx(2)


def test_stats_of_an_empty_queue(conn: sa.Connection) -> None:
    result = stats(conn)
    assert (result.queues, result.tasks, result.workers) == ([], [], [])


# -- purge -----------------------------------------------------------------------------------


# -- check -----------------------------------------------------------------------------------


ALL_CHECKS = [
    "schema",
    "workers",
    "backlog",
    "paused",
    "leases",
    "dead_jobs",
    "vacuum",
    "transactions",
    "replication_slots",
]


def test_check_all_ok_with_a_live_worker(conn: sa.Connection) -> None:
    add_worker(conn, "w1")
    add_job(conn)  # due now: no wait to speak of
    # The tier's tests share one database and roll back: the rows earlier tests inserted are
    # dead versions in its jobs table until autovacuum comes (hundreds of thousands, on a
    # process whose tests ran the statement-cost ones first), not a state this test sets up.
    found = findings(conn, max_dead_tuples=10**9)
    assert list(found) == ALL_CHECKS
    assert {f.severity for f in found.values()} == {"ok"}, found
    assert SCHEMA_REVISION in found["schema"].message
    assert worst(found.values()) == "ok"


def test_check_without_live_workers(conn: sa.Connection) -> None:
    add_worker(conn, "stale", seen_ago=300)
    assert findings(conn)["workers"].severity == "warning"  # nothing is due
    add_job(conn)
    found = findings(conn)
    assert found["workers"].severity == "critical"
    assert found["workers"].action
    assert worst(found.values()) == "critical"
    add_worker(conn, "fresh")
    assert findings(conn)["workers"].severity == "ok"


def test_check_without_live_workers_and_only_paused_queues_due_is_a_warning(
    conn: sa.Connection,
) -> None:
    add_worker(conn, "stale", seen_ago=300)
    add_job(conn, queue="held")
    pause_queue(conn, "held")
    workers = findings(conn)["workers"]
    assert workers.severity == "warning"  # a worker would not start them either
    assert workers.message.endswith("0 job(s) due (and 1 in paused queues)")
    add_job(conn, queue="open")
    assert findings(conn)["workers"].severity == "critical"


def test_check_backlog_waiting_too_long(conn: sa.Connection) -> None:
    add_worker(conn, "w1")
    add_job(conn, queue="slow", visible_in=-600)
    add_job(conn, queue="fine", visible_in=-10)
    add_job(conn, queue="later", visible_in=-3600 + 7200)  # due in an hour
    backlog = findings(conn, max_wait=timedelta(minutes=5))["backlog"]
    assert backlog.severity == "warning"
    assert "slow" in backlog.message
    assert "fine" not in backlog.message
    assert backlog.value is not None
    assert 600 <= backlog.value < 660
    assert findings(conn, max_wait=timedelta(minutes=15))["backlog"].severity == "ok"


def test_check_backlog_names_the_longest_waits_and_counts_the_rest(conn: sa.Connection) -> None:
    add_worker(conn, "w1")
    for n in range(NAMED_QUEUES + 2):
        add_job(conn, queue=f"q{n:02}", visible_in=-600 - 60 * n)
    add_job(conn, queue="q11", visible_in=-10)  # a queue's count is all its due jobs
    add_job(conn, queue="fine", visible_in=-10)
    add_job(conn, queue="held", visible_in=-900)
    pause_queue(conn, "held")
    found = findings(conn, max_wait=timedelta(minutes=5))
    backlog = found["backlog"]
    named = [f"q{n:02}" for n in range(NAMED_QUEUES + 1, 1, -1)]  # the longest waits first
    assert re.findall(r"(q\d\d) \(", backlog.message) == named, backlog.message
    assert backlog.message.endswith(" and 2 more queue(s)"), backlog.message
    assert "held" not in backlog.message
    assert backlog.value is not None
    assert 600 + 60 * (NAMED_QUEUES + 1) <= backlog.value < 660 + 60 * (NAMED_QUEUES + 1)
    assert "q11 (2 due, oldest 21m)" in backlog.message


def test_check_expired_leases(conn: sa.Connection) -> None:
    add_worker(conn, "w1")
    job_id = add_job(conn, status="running", attempts=1, started_ago=60, visible_in=20)
    assert findings(conn, lease_grace=timedelta(0))["leases"].severity == "ok"
    # the worker stopped renewing: the lease ran out 2 min ago
    conn.execute(update(jobs_table).where(j.id == job_id).values(visible_at=ago(120)))
    leases = findings(conn, lease_grace=timedelta(minutes=1))["leases"]
    assert (leases.severity, leases.value) == ("warning", 1)
    assert findings(conn, lease_grace=timedelta(minutes=5))["leases"].severity == "ok"


def test_check_recent_dead_jobs(conn: sa.Connection) -> None:
    add_worker(conn, "w1")
    add_dead(conn, finished_ago=7200)
    assert findings(conn, dead_window=timedelta(hours=1))["dead_jobs"].severity == "ok"
    add_dead(conn, finished_ago=60)
    add_dead(conn, finished_ago=60)
    dead = findings(conn, dead_window=timedelta(hours=1))["dead_jobs"]
    assert (dead.severity, dead.value) == ("warning", 2)
    assert findings(conn, max_dead=2)["dead_jobs"].severity == "ok"


def test_check_an_outdated_schema(conn: sa.Connection) -> None:
    conn.exec_driver_sql("UPDATE sa_jobqueue_alembic_version SET version_num = 'sajq_0001'")
    schema = findings(conn)["schema"]
    assert schema.severity == "critical"
    assert "sajq_0001" in schema.message


# -- the worker registry ---------------------------------------------------------------------


def worker_rows(conn: sa.Connection) -> dict[str, Any]:
    return {r.name: r for r in conn.execute(select(workers_table))}


def test_register_touch_unregister(conn: sa.Connection) -> None:
    register_worker(conn, "h:1:a", "h", 1, ["default", "mail"], 8)
    (first,) = worker_rows(conn).values()
    assert (first.host, first.pid, first.queues, first.concurrency) == (
        "h",
        1,
        ["default", "mail"],
        8,
    )
    # a restart under the same name replaces the row
    register_worker(conn, "h:1:a", "h2", 2, ["mail"], 2)
    again = worker_rows(conn)["h:1:a"]
    assert (again.host, again.pid, again.queues, again.concurrency) == ("h2", 2, ["mail"], 2)

    conn.execute(update(workers_table).values(last_seen_at=ago(3600)))
    assert touch_worker(conn, "h:1:a") is True
    fresh = conn.execute(select(func.now() - w.last_seen_at)).scalar_one()
    assert fresh < timedelta(seconds=5)

    assert unregister_worker(conn, "h:1:a") is True
    assert unregister_worker(conn, "h:1:a") is False
    assert touch_worker(conn, "h:1:a") is False  # gone: the worker should register again
    assert worker_rows(conn) == {}


def test_expire_workers_removes_only_stale_rows(conn: sa.Connection) -> None:
    add_worker(conn, "fresh", seen_ago=10)
    add_worker(conn, "stale", seen_ago=600)
    assert expire_workers(conn, timedelta(minutes=5)) == ["stale"]
    assert expire_workers(conn, timedelta(minutes=5)) == []
    assert set(worker_rows(conn)) == {"fresh"}
