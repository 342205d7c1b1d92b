"""Unique jobs that need no second connection: what one transaction's enqueues get back."""

from __future__ import annotations

import json
import pickle

import pytest
import sqlalchemy as sa
from sqlalchemy import select
from sqlalchemy.orm import Session

from sa_jobqueue import Enqueued, JobQueue
from tests.acceptance.test_unique_jobs import finish, j, live, queue, set_running

__all__ = ["queue"]  # the fixture: the tasks these tests enqueue


def test_a_live_key_is_held_per_task(session: Session, queue: JobQueue) -> None:
    with session.begin():
        first = queue.enqueue(session, "sync", {"n": 1}, unique_key="k")
    with session.begin():
        again = queue.enqueue(session, "sync", {"n": 2}, unique_key="k", priority=-5)
        other_task = queue.enqueue(session, "other", {"n": 3}, unique_key="k")
        other_key = queue.enqueue(session, "sync", {"n": 4}, unique_key="k2")
        keyless = [queue.enqueue(session, "sync", {"n": 5}) for _ in range(2)]
    assert isinstance(first, Enqueued)
    assert first.created
    assert again == first
    assert not again.created
    assert (other_task.created, other_key.created) == (True, True)
    assert all(job.created for job in keyless)
    assert len({first, other_task, other_key, *keyless}) == 5
    # The live job is left as it was: first come, first served.
    info = queue.get_job(session, first)
    assert info is not None
    assert (info.payload, info.priority, info.unique_key) == ({"n": 1}, 0, "k")


@pytest.mark.parametrize("outcome", ["succeeded", "dead", "cancelled"])
def test_a_running_job_holds_its_key_and_a_finished_one_frees_it(
    conn: sa.Connection, session: Session, queue: JobQueue, outcome: str
) -> None:
    with session.begin():
        first = queue.enqueue(session, "sync", {"n": 1}, unique_key="k")
    set_running(conn, first)
    with session.begin():
        assert queue.enqueue(session, "sync", {"n": 2}, unique_key="k") == first
    finish(conn, first, outcome)
    with session.begin():
        second = queue.enqueue(session, "sync", {"n": 3}, unique_key="k")
    assert second.created
    assert second != first
    assert live(conn, "sync", "k") == [second]
    # The finished job keeps its key as history; only live jobs hold it.
    old = queue.get_job(session, first)
    assert old is not None
    assert (old.status, old.unique_key) == (outcome, "k")


def test_the_tasks_key_function_and_an_explicit_key(
    conn: sa.Connection, session: Session, queue: JobQueue
) -> None:
    with session.begin():
        one = queue.enqueue(session, "per_user", {"user": 1})
        one_again = queue.enqueue(session, "per_user", {"user": 1, "extra": True})
        two = queue.enqueue(session, "per_user", {"user": 2})
        explicit = queue.enqueue(session, "per_user", {"user": 1}, unique_key="manual")
        no_key = [queue.enqueue(session, "per_user", {"anyone": True}) for _ in range(2)]
    assert (one.created, one_again.created, one_again) == (True, False, one)
    assert (two.created, explicit.created) == (True, True)
    assert explicit not in (one, two)
    assert all(job.created for job in no_key)
    assert live(conn, "per_user", "user:1") == [one]
    assert live(conn, "per_user", "manual") == [explicit]


def test_enqueued_is_an_int(session: Session, queue: JobQueue) -> None:
    with session.begin():
        job_id = queue.enqueue(session, "sync", {"n": 1}, unique_key="k")
        found = queue.enqueue(session, "sync", {"n": 1}, unique_key="k")
        # Usable wherever an id is: as a bind parameter, in get_job.
        assert session.execute(select(j.id).where(j.id == found)).scalar_one() == job_id
        info = queue.get_job(session, found)
        assert info is not None
        assert info.id == job_id
    assert isinstance(job_id, int)
    assert job_id == int(job_id)
    assert hash(job_id) == hash(int(job_id))
    assert {found: 1} == {int(job_id): 1}
    assert str(job_id) == repr(job_id) == f"{job_id}" == str(int(job_id))
    assert json.dumps({"id": found}) == json.dumps({"id": int(job_id)})
    copied = pickle.loads(pickle.dumps(found))
    assert (copied, copied.created) == (found, False)


def test_the_longest_key_is_accepted(session: Session, queue: JobQueue) -> None:
    longest = "é" * 500  # 1,000 bytes
    with session.begin():
        assert queue.enqueue(session, "sync", {}, unique_key=longest).created
        assert not queue.enqueue(session, "sync", {}, unique_key=longest).created
