"""Pausing and resuming a queue, in the caller's transaction: the claim, stats and check.

Each test runs in a transaction that is rolled back. Wake-ups at commit, other sessions and
real workers are in tests/acceptance/test_flow_control_workers.py.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from sa_jobqueue._sql.claiming import claim
from sa_jobqueue.errors import InvalidNameError
from sa_jobqueue.models import queues_table
from sa_jobqueue.ops import (
    list_queues,
    pause_queue,
    paused_queues,
    resume_queue,
    set_queue_concurrency,
    stats,
)
from tests.helpers.job_states import add_job
from tests.helpers.jobs import findings, row

q = queues_table.c


def claimed(conn: sa.Connection, queue: str = "default", limit: int = 10) -> list[int]:
    params = {"from_queue": queue, "limit": limit, "worker": "flow-test"}
    return [r.id for r in conn.execute(claim(), params)]


def test_a_paused_queue_gives_the_claim_nothing(conn: sa.Connection) -> None:
    job_id = add_job(conn)
    assert pause_queue(conn, "default") is True
    assert claimed(conn) == []
    assert row(conn, job_id).status == "queued"


def test_a_resumed_queue_is_claimed_from_again(conn: sa.Connection) -> None:
    job_id = add_job(conn)
    pause_queue(conn, "default")
    assert resume_queue(conn, "default") is True
    assert claimed(conn) == [job_id]
    assert row(conn, job_id).status == "running"


def test_pausing_one_queue_leaves_the_others_running(conn: sa.Connection) -> None:
    add_job(conn, queue="emails")
    other = add_job(conn, queue="reports")
    pause_queue(conn, "emails")
    assert claimed(conn, "emails") == []
    assert claimed(conn, "reports") == [other]


def test_a_paused_queue_does_not_reclaim_expired_leases(conn: sa.Connection) -> None:
    lost = add_job(conn, status="running", attempts=1, started_ago=60, visible_in=-30)
    pause_queue(conn, "default")
    assert claimed(conn) == []
    assert row(conn, lost).attempts == 1
    resume_queue(conn, "default")
    assert claimed(conn) == [lost]
    assert row(conn, lost).attempts == 2


def test_pause_twice_keeps_the_first_pause_time(conn: sa.Connection) -> None:
    assert pause_queue(conn, "default") is True
    conn.execute(update(queues_table).values(paused_at=func.now() - timedelta(hours=1)))
    first = paused_queues(conn)["default"]
    assert pause_queue(conn, "default") is False
    assert paused_queues(conn) == {"default": first}


def test_resume_of_a_running_queue_changes_nothing(conn: sa.Connection) -> None:
    assert resume_queue(conn, "default") is False  # no row
    pause_queue(conn, "default")
    resume_queue(conn, "default")
    assert resume_queue(conn, "default") is False  # a row, not paused
    assert paused_queues(conn) == {}
    # The row stays, for the queue's other settings; only paused_at is cleared.
    assert conn.execute(select(q.queue, q.paused_at)).all() == [("default", None)]


def test_a_pause_rolled_back_leaves_the_queue_running(conn: sa.Connection) -> None:
    job_id = add_job(conn)
    savepoint = conn.begin_nested()
    pause_queue(conn, "default")
    savepoint.rollback()
    assert paused_queues(conn) == {}
    assert claimed(conn) == [job_id]


def test_a_resume_rolled_back_leaves_the_queue_paused(session: Session) -> None:
    conn = session.connection()
    add_job(conn)
    pause_queue(session, "default")
    session.commit()  # releases a savepoint of the test's transaction
    resume_queue(session, "default")
    session.rollback()
    assert list(paused_queues(session)) == ["default"]
    assert claimed(session.connection()) == []


@pytest.mark.parametrize("name", ["", "bad name", "x" * 65, None, 7])
def test_a_bad_queue_name_is_refused_before_any_sql(conn: sa.Connection, name: object) -> None:
    with pytest.raises(InvalidNameError):
        pause_queue(conn, name)  # type: ignore[arg-type]
    with pytest.raises(InvalidNameError):
        resume_queue(conn, name)  # type: ignore[arg-type]
    assert paused_queues(conn) == {}


def test_list_queues_shows_counts_and_what_holds_each_back(conn: sa.Connection) -> None:
    add_job(conn, queue="emails")
    add_job(conn, queue="emails", visible_in=3600)
    add_job(conn, queue="emails", status="running", attempts=1, started_ago=1, visible_in=30)
    add_job(conn, queue="reports")
    pause_queue(conn, "emails")
    pause_queue(conn, "idle")  # paused before it has any job
    found = {info.queue: info for info in list_queues(conn)}
    assert list(found) == ["emails", "idle", "reports"]
    emails = found["emails"]
    assert (emails.queued, emails.due, emails.running) == (2, 1, 1)
    assert emails.paused_at is not None
    assert emails.held_back_by == ["paused"]
    assert (found["idle"].queued, found["idle"].held_back_by) == (0, ["paused"])
    assert (found["reports"].due, found["reports"].held_back_by) == (1, [])


def test_stats_show_the_paused_state(conn: sa.Connection) -> None:
    add_job(conn, queue="emails")
    add_job(conn, queue="reports")
    pause_queue(conn, "emails")
    pause_queue(conn, "idle")
    by_queue = {s.queue: s for s in stats(conn).queues}
    assert by_queue["emails"].paused_at is not None
    assert by_queue["idle"].paused_at is not None
    assert by_queue["reports"].paused_at is None


def _paused_ago(conn: sa.Connection, queue: str, age: timedelta) -> None:
    pause_queue(conn, queue)
    conn.execute(update(queues_table).where(q.queue == queue).values(paused_at=func.now() - age))


def test_check_warns_of_a_queue_paused_long_with_due_jobs(conn: sa.Connection) -> None:
    add_job(conn, queue="emails", created_ago=7200, visible_in=-7200)
    _paused_ago(conn, "emails", timedelta(hours=2))
    found = findings(conn, max_paused=timedelta(hours=1))
    assert found["paused"].severity == "warning"
    assert "emails" in found["paused"].message
    assert found["paused"].value == pytest.approx(7200, abs=60)
    # Its due jobs wait by design: the backlog check leaves them to this one.
    assert found["backlog"].severity == "ok"


@pytest.mark.parametrize(
    ("paused_for", "due"),
    [(timedelta(minutes=5), True), (timedelta(hours=2), False)],
    ids=["paused-briefly", "nothing-due"],
)
def test_check_accepts_a_short_pause_or_one_with_nothing_due(
    conn: sa.Connection, paused_for: timedelta, due: bool
) -> None:
    add_job(conn, queue="emails", visible_in=0 if due else 3600)
    _paused_ago(conn, "emails", paused_for)
    assert findings(conn, max_paused=timedelta(hours=1))["paused"].severity == "ok"


def test_a_queue_whose_running_job_lost_its_lease_is_not_at_its_cap(conn: sa.Connection) -> None:
    add_job(conn, queue="emails")
    add_job(conn, queue="emails", status="running", attempts=1, started_ago=60, visible_in=-5)
    set_queue_concurrency(conn, "emails", 1)
    (emails,) = list_queues(conn)
    # Its worker is gone: the job is running, but its slot is free for the next claim.
    assert (emails.running, emails.holding, emails.held_back_by) == (1, 0, [])
    add_job(conn, queue="emails", status="running", attempts=1, started_ago=1, visible_in=30)
    (emails,) = list_queues(conn)
    assert (emails.running, emails.holding, emails.held_back_by) == (2, 1, ["at cap"])
