"""Job admin without a JobQueue: the functions of sa_jobqueue.ops.admin on a Connection.

Operators' tools call these directly; ``JobQueue``'s admin methods delegate to them (their own
tests are in test_operations.py).
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from sa_jobqueue import InvalidJobError, JobInfo
from sa_jobqueue.ops.admin import cancel_job, count_jobs, get_job, list_jobs, requeue_job
from tests.helpers.job_states import add_dead, add_job
from tests.helpers.jobs import row


def test_jobs_are_read_listed_and_counted(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        first = add_job(conn, queue="mail", task="send", payload={"to": "a"})
        second = add_job(
            conn, queue="mail", task="send", status="running", attempts=1, started_ago=1
        )
        dead = add_dead(conn, queue="reports")
    with engine.connect() as conn:
        info = get_job(conn, first)
        assert isinstance(info, JobInfo)
        assert (info.queue, info.task, info.payload, info.status) == (
            "mail",
            "send",
            {"to": "a"},
            "queued",
        )
        assert info.id == first
        assert get_job(conn, 123456) is None
        assert [j.id for j in list_jobs(conn)] == [first, second, dead]
        assert [j.id for j in list_jobs(conn, queue="mail", newest_first=True)] == [second, first]
        assert [j.id for j in list_jobs(conn, status=["dead", "running"])] == [second, dead]
        assert [j.id for j in list_jobs(conn, limit=1, after_id=first)] == [second]
        assert count_jobs(conn) == {"mail": {"queued": 1, "running": 1}, "reports": {"dead": 1}}


def test_cancel_and_requeue_run_in_the_callers_transaction(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        queued = add_job(conn)
        running = add_job(conn, status="running", attempts=1, started_ago=1)
        dead = add_dead(conn, attempts=2, max_attempts=2)
    with engine.connect() as conn:
        assert cancel_job(conn, queued) is True
        assert cancel_job(conn, running) is True
        assert requeue_job(conn, dead) is True
        assert requeue_job(conn, queued) is False  # cancelled now, not dead
        conn.rollback()
    assert (row(engine, queued).status, row(engine, dead).status) == ("queued", "dead")
    with engine.begin() as conn:
        assert cancel_job(conn, queued) is True
        assert cancel_job(conn, running) is True
        assert requeue_job(conn, dead, attempts="reset") is True
    assert row(engine, queued).status == "cancelled"
    assert row(engine, running).cancel_requested is True
    assert (row(engine, dead).status, row(engine, dead).attempts) == ("queued", 0)
    with engine.begin() as conn:
        assert cancel_job(conn, queued) is False  # finished: left as it is


def test_bad_arguments_are_refused_before_the_session_connects(engine: sa.Engine) -> None:
    with Session(engine) as session:
        with pytest.raises(InvalidJobError, match="extend"):
            requeue_job(session, 1, attempts="again")  # type: ignore[arg-type]
        with pytest.raises(InvalidJobError, match="limit"):
            list_jobs(session, limit=0)
        with pytest.raises(InvalidJobError, match="status"):
            list_jobs(session, status="lost")
        assert not session.in_transaction()
