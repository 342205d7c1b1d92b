"""Unique jobs, against a real PostgreSQL.

A job enqueued with a unique key is not added while a queued or running job of the same task
holds that key: the caller gets the live job's id instead, with ``created`` False. The partial
unique index is what enforces it, so the tests here are about what the caller sees: never an
IntegrityError, always the id of the live job, a key free again once its job has finished, the
race where that job finishes between the insert and the lookup, batches with duplicate keys,
and many enqueuers at once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy import event, func, select
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sa_jobqueue import Enqueued, InvalidJobError, JobQueue
from sa_jobqueue.database import create_engine
from sa_jobqueue.models import jobs_table
from tests.helpers.jobs import Bind, handler, reading, writing
from tests.helpers.notify import listening, notifications
from tests.helpers.waiting import wait_for

j = jobs_table.c


def user_key(payload: Any) -> str | None:
    return f"user:{payload['user']}" if isinstance(payload, dict) and "user" in payload else None


@pytest.fixture
def queue() -> JobQueue:
    queue = JobQueue()
    queue.task(name="sync", queue="a")(handler)
    queue.task(name="other", queue="a")(handler)
    queue.task(name="per_user", queue="b", unique_key=user_key)(handler)
    return queue


@pytest.fixture
def other_engine(database_url: URL) -> Iterator[sa.Engine]:
    """A second engine on the test's database, for what "another process" does."""
    engine = create_engine(database_url, isolation_level="AUTOCOMMIT")
    yield engine
    engine.dispose()


def finish(engine: Bind, job_id: int, status: str = "succeeded") -> None:
    with writing(engine) as conn:
        done = conn.execute(
            sa.update(jobs_table)
            .where(j.id == job_id)
            .values(status=status, finished_at=func.now(), worker=None)
        ).rowcount
    assert done == 1


def set_running(engine: Bind, job_id: int) -> None:
    with writing(engine) as conn:
        conn.execute(
            sa.update(jobs_table)
            .where(j.id == job_id)
            .values(status="running", attempts=1, started_at=func.now())
        )


def live(engine: Bind, task: str, key: str) -> list[int]:
    with reading(engine) as conn:
        return list(
            conn.execute(
                select(j.id)
                .where(j.task == task, j.unique_key == key, j.status.in_(["queued", "running"]))
                .order_by(j.id)
            ).scalars()
        )


def payload_of(engine: Bind, job_id: int) -> Any:
    with reading(engine) as conn:
        return conn.execute(select(j.payload).where(j.id == job_id)).scalar_one()


# -- one job at a time --------------------------------------------------------------------------


def test_twice_in_one_transaction_and_rolled_back(engine: sa.Engine, queue: JobQueue) -> None:
    with Session(engine) as session:
        first = queue.enqueue(session, "sync", {"n": 1}, unique_key="k")
        second = queue.enqueue(session, "sync", {"n": 2}, unique_key="k")
        assert (second, first.created, second.created) == (first, True, False)
        session.rollback()
    assert live(engine, "sync", "k") == []
    with engine.connect() as conn:
        third = queue.enqueue(conn, "sync", {"n": 3}, unique_key="k")
        conn.commit()
    assert third.created
    assert live(engine, "sync", "k") == [third]


def test_a_job_that_was_not_added_sends_no_notification(
    engine: sa.Engine, queue: JobQueue, sent_sql: list[str]
) -> None:
    with Session(engine) as session, session.begin():
        queue.enqueue(session, "sync", {"n": 1}, unique_key="k")
    with listening(engine) as listener:
        with Session(engine) as session, session.begin():
            assert not queue.enqueue(session, "sync", {"n": 2}, unique_key="k").created
        assert notifications(listener, engine) == []
        # A later job of the same transaction still wakes the queue: nothing was sent before.
        with Session(engine) as session, session.begin():
            assert not queue.enqueue(session, "sync", {"n": 3}, unique_key="k").created
            assert queue.enqueue_many(session, "sync", [{"n": 4}], unique_keys=["k"])[0] == 1
            queue.enqueue(session, "sync", {"n": 5}, unique_key="fresh")
            queue.enqueue(session, "sync", {"n": 6}, unique_key="fresher")
        assert notifications(listener, engine) == ["a"]
    asked = [s for s in sent_sql if "pg_notify" in s and "sa_jobqueue_jobs" in s]
    assert len(asked) >= 2  # the insert asks for the wake-up; only inserted rows run it


# -- batches ------------------------------------------------------------------------------------


def test_a_batch_with_keys_duplicates_and_a_live_key(
    engine: sa.Engine, queue: JobQueue, sent_sql: list[str]
) -> None:
    with Session(engine) as session, session.begin():
        held = queue.enqueue(session, "sync", {"held": True}, unique_key="c")
    payloads = [{"i": i} for i in range(7)]
    keys = ["a", None, "b", "a", None, "c", "a"]
    with Session(engine) as session, session.begin():
        session.connection()
        before = len(sent_sql)
        jobs = queue.enqueue_many(session, "sync", payloads, unique_keys=keys)
        statements = sent_sql[before:]
    assert [job.created for job in jobs] == [True, True, True, False, True, False, False]
    assert jobs[3] == jobs[6] == jobs[0]
    assert jobs[5] == held
    assert len({jobs[0], jobs[1], jobs[2], jobs[4], held}) == 5
    assert [payload_of(engine, jobs[i]) for i in (0, 1, 2, 4)] == [{"i": i} for i in (0, 1, 2, 4)]
    assert live(engine, "sync", "a") == [jobs[0]]
    # One insert (the NOTIFY rides in its RETURNING), one lookup for the key that was held.
    assert [s.split()[0] for s in statements] == ["INSERT", "SELECT"]
    assert "pg_notify" in statements[0]


def test_a_batch_without_conflicts_is_one_statement_and_uses_the_task_function(
    engine: sa.Engine, queue: JobQueue, sent_sql: list[str]
) -> None:
    with Session(engine) as session, session.begin():
        session.connection()
        before = len(sent_sql)
        jobs = queue.enqueue_many(session, "per_user", [{"user": u} for u in (1, 2, 1, 3)])
        statements = sent_sql[before:]
        again = queue.enqueue_many(session, "per_user", [{"user": 3}, {"user": 4}])
    assert [job.created for job in jobs] == [True, True, False, True]
    assert jobs[2] == jobs[0]
    assert len(statements) == 1  # the INSERT, its NOTIFY in its RETURNING
    assert "pg_notify" in statements[0]
    assert (again[0], again[0].created, again[1].created) == (jobs[3], False, True)
    assert live(engine, "per_user", "user:1") == [jobs[0]]


def test_a_batch_of_only_held_keys_adds_nothing_and_sends_no_notification(
    engine: sa.Engine, queue: JobQueue
) -> None:
    with Session(engine) as session, session.begin():
        held = queue.enqueue_many(session, "sync", [{"n": 1}, {"n": 2}], unique_keys=["x", "y"])
    with listening(engine) as listener:
        with Session(engine) as session, session.begin():
            again = queue.enqueue_many(session, "sync", [{}, {}, {}], unique_keys=["y", "x", "y"])
        assert notifications(listener, engine) == []
    assert again == [held[1], held[0], held[1]]
    assert not any(job.created for job in again)


# -- refused before any SQL ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "message"),
    [
        pytest.param(42, "str", id="int"),
        pytest.param(b"k", "str", id="bytes"),
        pytest.param("nul\x00", "NUL", id="nul"),
        pytest.param("é" * 501, "1002 bytes", id="too-long"),
        pytest.param("lone \ud800", "Unicode", id="surrogate"),
    ],
)
def test_bad_keys_are_refused_before_any_sql(
    engine: sa.Engine, queue: JobQueue, sent_sql: list[str], key: Any, message: str
) -> None:
    queue.task(name="bad_function", unique_key=lambda payload: key)(handler)
    with Session(engine) as session:
        for attempt in [
            lambda: queue.enqueue(session, "sync", {}, unique_key=key),
            lambda: queue.enqueue_many(session, "sync", [{}, {}], unique_keys=["ok", key]),
            lambda: queue.enqueue(session, "bad_function", {}),
        ]:
            with pytest.raises(InvalidJobError, match=message):
                attempt()
        with pytest.raises(InvalidJobError, match="2 entries for 3 payloads"):
            queue.enqueue_many(session, "sync", [{}, {}, {}], unique_keys=["a", "b"])
    assert sent_sql == []


# -- races ---------------------------------------------------------------------------------------


def _finish_during_first_lookup(engine: sa.Engine, other: sa.Engine, job_id: int) -> list[str]:
    """Make ``job_id`` finish (committed, by another connection) just before the first lookup
    of a live key runs on ``engine``: the lookup then finds no live job."""
    sent: list[str] = []

    def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "unique_key = ANY" in statement and not any("unique_key = ANY" in s for s in sent):
            finish(other, job_id)
        sent.append(statement)

    event.listen(engine, "before_cursor_execute", before)
    return sent


def test_the_holder_finishing_between_insert_and_lookup_is_retried(
    engine: sa.Engine, other_engine: sa.Engine, queue: JobQueue
) -> None:
    with Session(engine) as session, session.begin():
        holder = queue.enqueue(session, "sync", {"n": 1}, unique_key="k")
    sent = _finish_during_first_lookup(engine, other_engine, holder)
    with Session(engine) as session, session.begin():
        job = queue.enqueue(session, "sync", {"n": 2}, unique_key="k")
    assert job.created
    assert job != holder
    kinds = [s.split()[0] for s in sent if "sa_jobqueue_jobs" in s]
    assert kinds == ["INSERT", "SELECT", "INSERT"]
    assert live(engine, "sync", "k") == [job]


def test_the_holder_finishing_during_a_batch_lookup_is_retried(
    engine: sa.Engine, other_engine: sa.Engine, queue: JobQueue
) -> None:
    with Session(engine) as session, session.begin():
        holders = queue.enqueue_many(session, "sync", [{}, {}], unique_keys=["k", "stays"])
    sent = _finish_during_first_lookup(engine, other_engine, holders[0])
    with Session(engine) as session, session.begin():
        jobs = queue.enqueue_many(
            session, "sync", [{"n": 1}, {"n": 2}, {"n": 3}], unique_keys=["k", "stays", "new"]
        )
    assert [job.created for job in jobs] == [True, False, True]
    assert jobs[1] == holders[1]
    assert jobs[0] not in holders
    kinds = [s.split()[0] for s in sent if "sa_jobqueue_jobs" in s]
    assert kinds == ["INSERT", "SELECT", "INSERT"]
    assert payload_of(engine, jobs[0]) == {"n": 1}


def _waiting_for_a_lock(engine: sa.Engine) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
        )


@pytest.mark.parametrize("holder_commits", [True, False], ids=["commit", "rollback"])
def test_a_key_taken_by_an_uncommitted_transaction_waits_for_it(
    engine: sa.Engine, queue: JobQueue, holder_commits: bool
) -> None:
    results: list[Enqueued] = []
    errors: list[BaseException] = []

    def second_enqueuer() -> None:
        try:
            with Session(engine) as session, session.begin():
                results.append(queue.enqueue(session, "sync", {"n": 2}, unique_key="k"))
        except BaseException as exc:
            errors.append(exc)

    with Session(engine) as holder:
        first = queue.enqueue(holder, "sync", {"n": 1}, unique_key="k")
        thread = threading.Thread(target=second_enqueuer)
        thread.start()
        wait_for(lambda: _waiting_for_a_lock(engine))
        assert results == []
        if holder_commits:
            holder.commit()
        else:
            holder.rollback()
    thread.join(10)
    assert not errors, errors
    (second,) = results
    if holder_commits:
        assert (second, second.created) == (first, False)
    else:
        assert second.created
        assert live(engine, "sync", "k") == [second]


def test_under_repeatable_read_a_key_committed_after_the_snapshot_is_a_serialization_error(
    engine: sa.Engine, other_engine: sa.Engine, queue: JobQueue
) -> None:
    with Session(engine) as session:
        session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        session.execute(select(1))  # the snapshot is taken here
        with other_engine.connect() as other:
            queue.enqueue(other, "sync", {"n": 1}, unique_key="k")
            other.commit()
        with pytest.raises(sa.exc.OperationalError) as raised:
            queue.enqueue(session, "sync", {"n": 2}, unique_key="k")
        assert isinstance(raised.value.orig, psycopg.errors.SerializationFailure)


def test_many_enqueuers_get_one_job_per_round_and_reuse_the_key(
    engine: sa.Engine, queue: JobQueue
) -> None:
    """Six sessions enqueue the same key at once, round after round; between rounds the live
    job finishes. Each round exactly one of them creates the job and the others get its id."""
    threads_count, rounds = 6, 25
    barrier = threading.Barrier(threads_count + 1)
    results: list[list[Enqueued]] = [[] for _ in range(rounds)]
    errors: list[BaseException] = []
    lock = threading.Lock()

    def enqueuer(index: int) -> None:
        try:
            for k in range(rounds):
                barrier.wait(timeout=30)
                with Session(engine) as session, session.begin():
                    job = queue.enqueue(session, "sync", {"t": index, "r": k}, unique_key="hot")
                with lock:
                    results[k].append(job)
                barrier.wait(timeout=30)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=enqueuer, args=(i,)) for i in range(threads_count)]
    for thread in threads:
        thread.start()
    try:
        for k in range(rounds):
            barrier.wait(timeout=30)  # go
            barrier.wait(timeout=30)  # all done
            round_ = results[k]
            assert len(round_) == threads_count
            assert [job.created for job in round_].count(True) == 1
            assert len(set(round_)) == 1
            assert live(engine, "sync", "hot") == [round_[0]]
            finish(engine, round_[0])
    finally:
        barrier.abort()
        for thread in threads:
            thread.join(30)
    assert not errors, errors
    assert len({r[0] for r in results}) == rounds


def test_enqueuers_racing_a_finisher_always_get_a_job_holding_the_key(
    engine: sa.Engine, other_engine: sa.Engine, queue: JobQueue
) -> None:
    """Four sessions enqueue one key in a loop while another connection finishes whatever job
    holds it, as fast as it can: each call returns the id of a job with that key (the one it
    created, or one that was live when it looked), and never raises."""
    stop = threading.Event()
    results: list[Enqueued] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def enqueuer(index: int) -> None:
        try:
            for n in range(150):
                with Session(engine) as session, session.begin():
                    job = queue.enqueue(session, "sync", {"t": index, "n": n}, unique_key="hot")
                with lock:
                    results.append(job)
        except BaseException as exc:
            errors.append(exc)

    def finisher() -> None:
        try:
            with other_engine.connect() as conn:
                while not stop.is_set():
                    conn.execute(
                        sa.update(jobs_table)
                        .where(j.unique_key == "hot", j.status == "queued")
                        .values(status="succeeded", finished_at=func.now())
                    )
        except BaseException as exc:
            errors.append(exc)

    finishing = threading.Thread(target=finisher)
    finishing.start()
    threads = [threading.Thread(target=enqueuer, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    stop.set()
    finishing.join(10)
    assert not errors, errors
    assert len(results) == 600
    created = [job for job in results if job.created]
    assert len(created) == len(set(created))
    with engine.connect() as conn:
        rows = {
            job_id: key
            for job_id, key in conn.execute(select(j.id, j.unique_key).where(j.task == "sync"))
        }
    assert set(rows) == set(created)  # every row was reported created exactly once
    assert {rows[job] for job in results} == {"hot"}
    assert len(live(engine, "sync", "hot")) <= 1


def test_batches_with_the_same_keys_in_opposite_orders_do_not_deadlock(
    engine: sa.Engine, queue: JobQueue
) -> None:
    """Two sessions enqueue batches of the same 40 keys at once, one in the reverse order of the
    other, round after round: each key gets one job, and no statement is chosen as a deadlock
    victim (each batch takes its keys in one order, whatever order the payloads came in)."""
    keys = [f"k{n:02d}" for n in range(40)]
    rounds = 15
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def enqueuer(order: list[str]) -> None:
        try:
            for k in range(rounds):
                barrier.wait(timeout=30)
                with Session(engine) as session, session.begin():
                    queue.enqueue_many(
                        session,
                        "sync",
                        [{"r": k}] * len(order),
                        unique_keys=[f"{k}:{o}" for o in order],
                    )
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=enqueuer, args=(order,)) for order in (keys, keys[::-1])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    with reading(engine) as conn:
        per_key = conn.execute(
            select(j.unique_key, func.count()).where(j.task == "sync").group_by(j.unique_key)
        ).all()
    assert len(per_key) == rounds * len(keys)
    assert {n for _, n in per_key} == {1}
