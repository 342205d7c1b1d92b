"""What a first-time user meets at enqueue and list_jobs; each test is rolled back."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from sa_jobqueue import InvalidJobError, JobQueue
from sa_jobqueue.errors import InvalidNameError
from tests.acceptance.test_api_first_contact import queue
from tests.helpers.job_states import add_dead, add_job
from tests.helpers.jobs import count, handler

__all__ = ["queue"]  # the fixture: a queue with the task ``send``


@pytest.mark.parametrize("task", [print, handler, JobQueue], ids=["print", "handler", "class"])
def test_enqueue_of_something_that_is_not_a_task_is_a_type_error(
    conn: sa.Connection, session: Session, queue: JobQueue, task: Any
) -> None:
    with session.begin():
        for call in (
            lambda: queue.enqueue(session, task, {}),
            lambda: queue.enqueue_many(session, task, [{}]),
        ):
            with pytest.raises(TypeError) as refused:
                call()
            assert not isinstance(refused.value, InvalidJobError)
            message = str(refused.value)
            assert "Task" in message
            assert "name" in message
        if task is handler:
            assert "'send'" in message  # the handler of a registered task: say which
        queue.enqueue(session, "send", {})  # the transaction is still usable
    assert count(conn) == 1


def test_a_task_name_of_the_wrong_type_is_still_a_bad_name(
    session: Session, queue: JobQueue
) -> None:
    with pytest.raises(InvalidNameError):
        queue.enqueue(session, 42, {})  # type: ignore[arg-type]


def test_list_jobs_newest_first_pages_by_id(conn: sa.Connection, queue: JobQueue) -> None:
    dead = [add_dead(conn, queue="mail", task="send") for _ in range(5)]
    other = add_dead(conn, queue="mail", task="bounce")
    live = add_job(conn, queue="mail", task="send")

    everything = queue.list_jobs(conn, newest_first=True)
    assert [job.id for job in everything] == [live, other, *reversed(dead)]
    first = queue.list_jobs(conn, task="send", status="dead", limit=2, newest_first=True)
    assert [job.id for job in first] == [dead[4], dead[3]]
    rest = queue.list_jobs(
        conn, task="send", status="dead", after_id=first[-1].id, newest_first=True
    )
    assert [job.id for job in rest] == [dead[2], dead[1], dead[0]]
    # The same cursor read oldest first goes the other way from it.
    later = queue.list_jobs(conn, task="send", status="dead", after_id=first[-1].id)
    assert [job.id for job in later] == [dead[4]]


@pytest.mark.parametrize("job_id", [2**63, -(2**63) - 1, 2**70, True, "12", 1.5])
def test_a_job_id_the_column_cannot_hold_is_refused_before_the_caller_transaction_aborts(
    conn: sa.Connection, session: Session, queue: JobQueue, job_id: Any
) -> None:
    with session.begin():
        queue.enqueue(session, "send", {})
        for call in (
            lambda: queue.get_job(session, job_id),
            lambda: queue.cancel(session, job_id),
            lambda: queue.requeue(session, job_id),
            lambda: queue.get_result(session, job_id),
        ):
            with pytest.raises(InvalidJobError, match="job id"):
                call()
        queue.enqueue(session, "send", {})  # the transaction is still usable
    assert count(conn) == 2
