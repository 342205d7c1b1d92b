"""The enqueue side of the queue, against a real PostgreSQL.

What is checked here is the promise made to the caller of ``JobQueue.enqueue``: the job is part
of the caller's transaction (it exists exactly when that transaction commits), nothing of the
caller's is committed or flushed, idle workers are woken once per queue at commit, bad input is
refused before any SQL is sent, and scheduling options end up in the row as given.
"""

from __future__ import annotations

import enum
import itertools
import math
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy import func, select
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sa_jobqueue import JobInfo, JobQueue, JobQueueError
from sa_jobqueue._enqueue.inserting import COPY_FROM
from sa_jobqueue.database import create_engine
from sa_jobqueue.errors import (
    InvalidNameError,
    InvalidScheduleError,
    PayloadError,
    UnknownTaskError,
)
from sa_jobqueue.models import jobs_table
from tests.apps.application import AppBase, Order
from tests.helpers.databases import cloned_database
from tests.helpers.jobs import count, job, make_queue
from tests.helpers.notify import notifications, recording
from tests.helpers.protocol import pgconn_of, traced

# -- the application's side: a business table on a MetaData of its own ------------------------


TABLES = AppBase.metadata
orders_table = Order.__table__


@pytest.fixture
def queue() -> JobQueue:
    return make_queue()


@pytest.fixture(scope="module")
def shared_engine(server_url: URL, template_database: str) -> Iterator[sa.Engine]:
    """One migrated database for the many cases of refused input in this module.

    A fresh database per case would cost more than the case itself. Sharing is safe because a
    refused job leaves nothing behind, and each case counts only its own business rows.
    """
    with cloned_database(server_url, template_database, prefix="sajq_refusals") as url:
        engine = create_engine(url)
        try:
            AppBase.metadata.create_all(engine)
            yield engine
        finally:
            engine.dispose()


@pytest.fixture
def shared_sql(shared_engine: sa.Engine) -> Iterator[list[str]]:
    """Every statement the shared engine sends to the server during the test, in order."""
    yield from recording(shared_engine)


def info(queue: JobQueue, session: Session | sa.Connection, job_id: int) -> JobInfo:
    found = queue.get_job(session, job_id)
    assert found is not None, f"job {job_id} does not exist"
    return found


# -- 1. transactional outbox ----------------------------------------------------------------


def test_job_and_business_row_commit_together(tables: sa.Engine, queue: JobQueue) -> None:
    with Session(tables) as session:
        order = Order(note="ten widgets")
        session.add(order)
        session.flush()  # the caller's own flush, to learn the id it puts in the payload
        order_id = order.id
        job_id = queue.enqueue(session, "work_a", {"order_id": order_id})

        # Until the caller commits, no other connection (no worker) sees either row.
        assert count(tables) == 0
        assert count(tables, orders_table) == 0

        session.commit()

    assert count(tables) == 1
    assert count(tables, orders_table) == 1
    stored = job(tables, job_id)
    assert stored.payload == {"order_id": order_id}
    assert (stored.task, stored.queue, stored.status) == ("work_a", "a", "queued")


def test_rollback_discards_job_and_business_row(tables: sa.Engine, queue: JobQueue) -> None:
    with Session(tables) as session:
        session.add(Order(note="ten widgets"))
        session.flush()
        job_id = queue.enqueue(session, "work_a", {"order": 1})
        queue.enqueue_many(session, "work_b", [{"n": 1}, {"n": 2}])
        assert info(queue, session, job_id).status == "queued"  # visible inside the transaction
        session.rollback()
        assert queue.get_job(session, job_id) is None

    assert count(tables) == 0
    assert count(tables, orders_table) == 0


def test_exception_in_transaction_block_discards_the_job(
    tables: sa.Engine, queue: JobQueue
) -> None:
    class Boom(Exception):
        pass

    def business_that_fails() -> None:
        with Session(tables) as session, session.begin():
            session.add(Order(note="never"))
            queue.enqueue(session, "work_a", {"n": 1})
            raise Boom

    with pytest.raises(Boom):
        business_that_fails()

    assert count(tables) == 0
    assert count(tables, orders_table) == 0


# -- 2. enqueue neither commits nor flushes ---------------------------------------------------


def test_enqueue_leaves_pending_objects_unflushed_and_transaction_open(
    tables: sa.Engine, queue: JobQueue
) -> None:
    with Session(tables) as session:
        order = Order(note="pending")
        session.add(order)
        job_id = queue.enqueue(session, "work_a", {"n": 1})
        transaction = session.get_transaction()
        ids = queue.enqueue_many(session, "work_b", [{"n": 2}, {"n": 3}])

        assert order in session.new  # not flushed: still pending, no id
        assert order.id is None
        assert session.in_transaction()
        assert session.get_transaction() is transaction
        assert transaction is not None
        assert transaction.is_active
        # Not even the session's own connection has the business row: nothing was flushed.
        conn = session.connection()
        assert conn.execute(select(func.count()).select_from(orders_table)).scalar_one() == 0
        # The jobs are there, in the open transaction only.
        assert conn.execute(select(func.count()).select_from(jobs_table)).scalar_one() == 3
        assert {info(queue, session, i).status for i in [job_id, *ids]} == {"queued"}
        assert count(tables) == 0

    # Closing the session without a commit leaves nothing behind.
    assert count(tables) == 0
    assert count(tables, orders_table) == 0


def test_enqueue_on_connection_without_commit_is_rolled_back(
    engine: sa.Engine, queue: JobQueue
) -> None:
    with engine.connect() as conn:
        assert not conn.in_transaction()
        job_id = queue.enqueue(conn, "work_a", {"n": 1})
        ids = queue.enqueue_many(conn, "work_a", [{"n": 2}])
        assert conn.in_transaction()
        assert info(queue, conn, job_id).payload == {"n": 1}
        assert info(queue, conn, ids[0]).payload == {"n": 2}
        assert count(engine) == 0
        conn.rollback()
        assert queue.get_job(conn, job_id) is None
    assert count(engine) == 0


def test_enqueue_on_connection_commits_with_the_caller(engine: sa.Engine, queue: JobQueue) -> None:
    with engine.connect() as conn:
        with conn.begin() as transaction:
            job_id = queue.enqueue(conn, "work_a", {"n": 1})
            assert conn.get_transaction() is transaction
            assert transaction.is_active
            assert count(engine) == 0
        assert count(engine) == 1

        # A second transaction on the same connection, begun by enqueue itself.
        second = queue.enqueue(conn, "work_b", {"n": 2})
        assert conn.in_transaction()
        assert count(engine) == 1
        conn.commit()
    assert count(engine) == 2
    assert job(engine, job_id).payload == {"n": 1}
    assert job(engine, second).queue == "b"


def test_enqueue_refuses_what_is_not_a_session(engine: sa.Engine, queue: JobQueue) -> None:
    # An Engine is a producer's own transaction (tests/acceptance/test_standalone_enqueue.py).
    with pytest.raises(TypeError):
        queue.enqueue(engine.url, "work_a", {"n": 1})  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        queue.enqueue_many(engine.url, "work_a", [{"n": 1}])  # type: ignore[arg-type]
    assert count(engine) == 0


# -- 3. NOTIFY ------------------------------------------------------------------------------


def _notify_statements(sent: list[str]) -> int:
    return sum("pg_notify" in statement for statement in sent)


def test_one_notification_per_queue_delivered_at_commit(
    engine: sa.Engine,
    queue: JobQueue,
    listener: psycopg.Connection[Any],
    sent_sql: list[str],
) -> None:
    with Session(engine) as session, session.begin():
        queue.enqueue(session, "work_a", {"n": 1})
        queue.enqueue_many(session, "work_b", [{"n": 2}, {"n": 3}])
        queue.enqueue(session, "work_a", {"n": 4})
        queue.enqueue_many(session, "work_a", [{"n": 5}, {"n": 6}])
        queue.enqueue(session, "work_b", {"n": 7})
        queue.enqueue(session, "work_a", {"n": 8})
        asked = _notify_statements(sent_sql)
        # Not delivered before the commit.
        assert notifications(listener, engine) == []

    assert sorted(notifications(listener, engine)) == ["a", "b"]
    # PostgreSQL folds duplicates of one transaction, so the listener alone cannot tell: the
    # enqueue side itself asks for the wake-up once per queue, not once per job.
    assert asked == 2
    assert count(engine) == 8


def test_every_transaction_notifies_again(
    engine: sa.Engine, queue: JobQueue, listener: psycopg.Connection[Any]
) -> None:
    with Session(engine) as session:
        queue.enqueue(session, "work_a", {"n": 1})
        session.commit()
        assert notifications(listener, engine) == ["a"]
        queue.enqueue_many(session, "work_a", [{"n": 2}])
        session.commit()
        assert notifications(listener, engine) == ["a"]
    with engine.connect() as conn:
        queue.enqueue(conn, "work_a", {"n": 3})
        conn.commit()
        assert notifications(listener, engine) == ["a"]
        queue.enqueue(conn, "work_a", {"n": 4})
        conn.commit()
        assert notifications(listener, engine) == ["a"]


def test_rollback_sends_no_notification(
    engine: sa.Engine, queue: JobQueue, listener: psycopg.Connection[Any]
) -> None:
    with Session(engine) as session:
        queue.enqueue(session, "work_a", {"n": 1})
        queue.enqueue_many(session, "work_b", [{"n": 2}])
        session.rollback()
    with engine.connect() as conn:
        queue.enqueue(conn, "work_a", {"n": 3})
        conn.rollback()
    assert notifications(listener, engine) == []
    assert count(engine) == 0


def test_notification_survives_a_rolled_back_savepoint(
    engine: sa.Engine, queue: JobQueue, listener: psycopg.Connection[Any]
) -> None:
    with Session(engine) as session, session.begin():
        savepoint = session.begin_nested()
        queue.enqueue(session, "work_a", {"n": "dropped"})
        queue.enqueue_many(session, "work_b", [{"n": "dropped"}])
        savepoint.rollback()
        # The NOTIFYs sent inside the savepoint are gone with it; these must send their own.
        kept = queue.enqueue(session, "work_a", {"n": "kept"})
        kept_many = queue.enqueue_many(session, "work_b", [{"n": "kept"}])

    assert sorted(notifications(listener, engine)) == ["a", "b"]
    assert count(engine) == 2
    assert job(engine, kept).payload == {"n": "kept"}
    assert job(engine, kept_many[0]).payload == {"n": "kept"}


def test_notification_survives_a_rolled_back_savepoint_on_a_connection(
    engine: sa.Engine, queue: JobQueue, listener: psycopg.Connection[Any]
) -> None:
    with engine.connect() as conn:
        conn.begin()
        savepoint = conn.begin_nested()
        queue.enqueue(conn, "work_a", {"n": "dropped"})
        savepoint.rollback()
        queue.enqueue(conn, "work_a", {"n": "kept"})
        conn.commit()
    assert notifications(listener, engine) == ["a"]
    assert count(engine) == 1


def test_savepoint_rolled_back_alone_sends_nothing(
    engine: sa.Engine, queue: JobQueue, listener: psycopg.Connection[Any]
) -> None:
    with Session(engine) as session, session.begin():
        savepoint = session.begin_nested()
        queue.enqueue(session, "work_a", {"n": 1})
        savepoint.rollback()
        # The outer transaction commits, with nothing of ours left in it.
    assert notifications(listener, engine) == []
    assert count(engine) == 0


def test_released_savepoint_keeps_its_notification(
    engine: sa.Engine, queue: JobQueue, listener: psycopg.Connection[Any]
) -> None:
    with Session(engine) as session, session.begin():
        with session.begin_nested():
            queue.enqueue(session, "work_a", {"n": 1})
        queue.enqueue(session, "work_a", {"n": 2})
    assert notifications(listener, engine) == ["a"]
    assert count(engine) == 2


# -- 4. enqueue_many ------------------------------------------------------------------------


def _stored_payloads(engine: sa.Engine, ids: list[int]) -> list[Any]:
    with engine.connect() as conn:
        stored = dict(
            conn.execute(
                select(jobs_table.c.id, jobs_table.c.payload).where(jobs_table.c.id.in_(ids))
            ).all()
        )
    return [stored[i] for i in ids]


def test_enqueue_many_inserts_a_batch_below_the_copy_size_in_one_statement(
    engine: sa.Engine, queue: JobQueue, sent_sql: list[str], listener: psycopg.Connection[Any]
) -> None:
    payloads = [{"i": i, "tag": f"item-{i}"} for i in range(COPY_FROM - 1)]
    with Session(engine) as session, session.begin():
        session.connection()  # begin before counting
        before = len(sent_sql)
        ids = queue.enqueue_many(session, "work_a", payloads)
        batch = sent_sql[before:]

    # One statement: the INSERT, the NOTIFY in its RETURNING.
    assert [s.split()[0] for s in batch] == ["INSERT"]
    assert "pg_notify" in batch[0]
    assert len(ids) == len(set(ids)) == len(payloads)
    assert all(isinstance(i, int) for i in ids)
    # The ids come back in the order of the payloads.
    assert _stored_payloads(engine, ids) == payloads
    assert notifications(listener, engine) == ["a"]


def test_enqueue_many_copies_a_large_batch_after_one_statement(
    engine: sa.Engine, queue: JobQueue, sent_sql: list[str], listener: psycopg.Connection[Any]
) -> None:
    payloads = [{"i": i, "tag": f"item-{i}"} for i in range(2000)]
    with Session(engine) as session, session.begin():
        session.connection()  # begin before counting
        before = len(sent_sql)
        ids = queue.enqueue_many(session, "work_a", payloads)
        batch = sent_sql[before:]

    # Through SQLAlchemy, one statement: it draws the ids and sends the NOTIFY. The rows go
    # by COPY on the same connection, below SQLAlchemy's events.
    assert len(batch) == 1
    assert batch[0].startswith("SELECT")
    assert "nextval" in batch[0]
    assert "pg_notify" in batch[0]
    assert len(ids) == len(set(ids)) == len(payloads)
    assert ids == sorted(ids)
    assert _stored_payloads(engine, ids) == payloads
    assert notifications(listener, engine) == ["a"]


@pytest.mark.parametrize("empty", [[], (), iter([])], ids=["list", "tuple", "iterator"])
def test_enqueue_many_of_nothing_sends_nothing(
    engine: sa.Engine,
    queue: JobQueue,
    listener: psycopg.Connection[Any],
    sent_sql: list[str],
    empty: Any,
) -> None:
    with Session(engine) as session:
        assert queue.enqueue_many(session, "work_a", empty) == []
        assert sent_sql == []
        session.commit()
    with engine.connect() as conn:
        assert queue.enqueue_many(conn, "work_a", empty) == []
        assert sent_sql == []
        conn.commit()
    assert notifications(listener, engine) == []
    assert count(engine) == 0


def test_a_copied_batch_in_a_rolled_back_savepoint_leaves_nothing_and_sends_nothing(
    engine: sa.Engine, queue: JobQueue, listener: psycopg.Connection[Any]
) -> None:
    with Session(engine) as session, session.begin():
        savepoint = session.begin_nested()
        queue.enqueue_many(session, "work_a", [{"n": n} for n in range(COPY_FROM)])
        assert count(session.connection()) == COPY_FROM
        savepoint.rollback()
        assert count(session.connection()) == 0
    assert notifications(listener, engine) == []
    assert count(engine) == 0


def test_a_copied_batch_after_a_rolled_back_one_sends_its_own_notification(
    engine: sa.Engine, queue: JobQueue, listener: psycopg.Connection[Any]
) -> None:
    payloads = [{"n": n} for n in range(COPY_FROM)]
    with Session(engine) as session, session.begin():
        savepoint = session.begin_nested()
        queue.enqueue_many(session, "work_a", payloads)
        savepoint.rollback()
        kept = queue.enqueue_many(session, "work_a", payloads)
    assert notifications(listener, engine) == ["a"]
    assert count(engine) == COPY_FROM
    assert _stored_payloads(engine, kept) == payloads


def test_a_session_per_enqueue_costs_three_round_trips(
    database_url: URL, queue: JobQueue, listener: psycopg.Connection[Any]
) -> None:
    # psycopg prepares no statement here: its one-off preparing round trip would vary the count.
    # No ping at checkout either: the default engine's adds one round trip per session (what a
    # terminated pooled connection costs is then a ping, not a failed enqueue).
    engine = create_engine(
        database_url, connect_args={"prepare_threshold": None}, pool_pre_ping=False
    )
    try:
        with engine.connect() as conn:
            pgconn = pgconn_of(conn)
        with traced(pgconn) as traffic, Session(engine) as session:
            queue.enqueue(session, "work_a", {"n": 1})
            session.commit()
        # BEGIN, the INSERT (its NOTIFY in its RETURNING), COMMIT: what a plain INSERT and
        # COMMIT cost with psycopg alone.
        assert traffic.round_trips == 3
        assert traffic.queries[0] == "BEGIN"
        assert traffic.queries[-1] == "COMMIT"
        assert notifications(listener, engine) == ["a"]
    finally:
        engine.dispose()


@pytest.mark.parametrize("size", [1, COPY_FROM], ids=["insert", "copy"])
def test_a_database_error_is_raised_as_sqlalchemy_raises_it(
    engine: sa.Engine, queue: JobQueue, size: int
) -> None:
    # Straight to psycopg (one job) or by COPY (a batch), a failure looks like one of
    # SQLAlchemy's execute: here, a lock not granted in time.
    with engine.connect() as holder:
        holder.execute(sa.text("LOCK TABLE sa_jobqueue_jobs IN ACCESS EXCLUSIVE MODE"))
        with Session(engine) as session:
            session.execute(sa.text("SET LOCAL lock_timeout = '50ms'"))
            with pytest.raises(sa.exc.OperationalError) as raised:
                queue.enqueue_many(session, "work_a", [{"n": n} for n in range(size)])
            assert isinstance(raised.value.orig, psycopg.errors.LockNotAvailable)
            session.rollback()
        holder.rollback()
    with Session(engine) as session, session.begin():
        queue.enqueue_many(session, "work_a", [{"n": n} for n in range(size)])
    assert count(engine) == size


def test_an_enqueue_first_in_a_transaction_behind_a_transaction_pooler_gets_its_settings(
    database_url: URL, queue: JobQueue
) -> None:
    # The transaction pooler's settings are applied by SQLAlchemy events before a
    # transaction's first statement: the INSERT must go through them, not around them.
    engine = create_engine(
        database_url, pooler="transaction", settings={"application_name": "enqueue-first"}
    )
    try:
        with Session(engine) as session:
            queue.enqueue(session, "work_a", {"n": 1})
            name = session.execute(sa.text("SHOW application_name")).scalar_one()
            session.commit()
    finally:
        engine.dispose()
    assert name == "enqueue-first"


# -- 5. bad input is refused before any SQL -------------------------------------------------


def _circular_dict() -> dict[str, Any]:
    loop: dict[str, Any] = {"a": 1}
    loop["self"] = loop
    return loop


def _circular_list() -> list[Any]:
    loop: list[Any] = [1]
    loop.append({"back": loop})
    return loop


class Opaque:
    pass


class _Level(enum.IntEnum):
    HIGH = 1


def _deep(levels: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels - 1):
        value = [value]
    return value


BAD_PAYLOADS = [
    pytest.param({1, 2}, id="set"),
    pytest.param({"s": frozenset({1})}, id="nested-frozenset"),
    pytest.param(b"bytes", id="bytes"),
    pytest.param({"b": bytearray(b"x")}, id="nested-bytearray"),
    pytest.param(datetime(2030, 1, 1, tzinfo=UTC), id="datetime"),
    pytest.param({"when": date(2030, 1, 1)}, id="nested-date"),
    pytest.param(Decimal("1.5"), id="decimal"),
    pytest.param(Opaque(), id="object"),
    pytest.param({"o": [Opaque()]}, id="nested-object"),
    pytest.param(_circular_dict(), id="circular-dict"),
    pytest.param(_circular_list(), id="circular-list"),
    pytest.param(math.nan, id="nan"),
    pytest.param({"x": math.inf}, id="infinity"),
    pytest.param([1.0, -math.inf], id="negative-infinity"),
    pytest.param({"deep": {"deeper": [math.nan]}}, id="nested-nan"),
    pytest.param("nul\x00here", id="nul-in-string"),
    pytest.param({"k": ["fine", "nul\x00"]}, id="nul-in-nested-string"),
    pytest.param({"nul\x00key": 1}, id="nul-in-key"),
    pytest.param([{"inner": {"\x00": 1}}], id="nul-in-nested-key"),
    pytest.param({1: "one"}, id="int-key"),
    pytest.param({None: "none"}, id="none-key"),
    pytest.param({True: "yes"}, id="bool-key"),
    pytest.param({1.5: "x"}, id="float-key"),
    pytest.param({"ok": {2: "two"}}, id="nested-int-key"),
    pytest.param([{"ok": 1}, {3: "three"}], id="int-key-in-list"),
    pytest.param((1, 2), id="tuple"),
    pytest.param({"t": (1, 2)}, id="nested-tuple"),
    pytest.param([[1, (2,)]], id="tuple-in-list"),
    pytest.param({"text": "lone surrogate \ud800"}, id="lone-surrogate"),
    # What jsonb or the worker would hand back changed (see test_payload_fidelity.py).
    pytest.param({"z": [1.0, -0.0]}, id="negative-zero"),
    pytest.param({"n": 10**4300}, id="int-over-4300-digits"),
    pytest.param({"level": _Level.HIGH}, id="int-enum"),
    pytest.param(_deep(201), id="nested-over-200-levels"),
]

#: (options for enqueue, the exception they must raise). The task is "work_a" unless given.
BAD_OPTIONS = [
    pytest.param({"task": ""}, InvalidNameError, id="task-empty"),
    pytest.param({"task": "9lives"}, InvalidNameError, id="task-leading-digit"),
    pytest.param({"task": "has space"}, InvalidNameError, id="task-space"),
    pytest.param({"task": "x" * 201}, InvalidNameError, id="task-too-long"),
    pytest.param({"task": "tab\tname"}, InvalidNameError, id="task-control-char"),
    pytest.param({"task": "work_a\n"}, InvalidNameError, id="task-trailing-newline"),
    pytest.param({"task": 42}, InvalidNameError, id="task-int"),
    pytest.param({"task": None}, InvalidNameError, id="task-none"),
    pytest.param({"task": b"work_a"}, InvalidNameError, id="task-bytes"),
    pytest.param({"task": "nope"}, UnknownTaskError, id="task-unknown"),
    pytest.param({"task": "x" * 200}, UnknownTaskError, id="task-unknown-longest"),
    pytest.param({"queue": ""}, InvalidNameError, id="queue-empty"),
    pytest.param({"queue": "q" * 65}, InvalidNameError, id="queue-too-long"),
    pytest.param({"queue": "two words"}, InvalidNameError, id="queue-space"),
    pytest.param({"queue": "-dash"}, InvalidNameError, id="queue-leading-dash"),
    pytest.param({"queue": "a/b"}, InvalidNameError, id="queue-slash"),
    pytest.param({"queue": "café"}, InvalidNameError, id="queue-non-ascii"),
    pytest.param({"queue": "a\n"}, InvalidNameError, id="queue-trailing-newline"),
    pytest.param({"queue": 7}, InvalidNameError, id="queue-int"),
    pytest.param({"queue": b"a"}, InvalidNameError, id="queue-bytes"),
    pytest.param({"run_at": datetime(2030, 1, 1, 12)}, InvalidScheduleError, id="run_at-naive"),
    pytest.param({"run_at": timedelta(seconds=-1)}, InvalidScheduleError, id="run_at-negative"),
    pytest.param({"run_at": 60}, InvalidScheduleError, id="run_at-int"),
    pytest.param({"run_at": "2030-01-01T00:00Z"}, InvalidScheduleError, id="run_at-str"),
    pytest.param({"run_at": date(2030, 1, 1)}, InvalidScheduleError, id="run_at-date"),
    # A delay beyond the range of timestamptz can only fail in the database.
    pytest.param({"run_at": timedelta.max}, InvalidScheduleError, id="run_at-huge-delay"),
    pytest.param({"priority": 32768}, InvalidScheduleError, id="priority-too-high"),
    pytest.param({"priority": -32769}, InvalidScheduleError, id="priority-too-low"),
    pytest.param({"priority": 1.5}, InvalidScheduleError, id="priority-float"),
    pytest.param({"priority": "1"}, InvalidScheduleError, id="priority-str"),
    pytest.param({"priority": True}, InvalidScheduleError, id="priority-bool"),
    pytest.param({"max_attempts": 0}, InvalidScheduleError, id="max_attempts-zero"),
    pytest.param({"max_attempts": -3}, InvalidScheduleError, id="max_attempts-negative"),
    pytest.param({"max_attempts": 2.0}, InvalidScheduleError, id="max_attempts-float"),
    pytest.param({"max_attempts": True}, InvalidScheduleError, id="max_attempts-bool"),
    pytest.param({"max_attempts": "3"}, InvalidScheduleError, id="max_attempts-str"),
    # The column is an integer (int4): a larger count can only fail in the database.
    pytest.param({"max_attempts": 2**31}, InvalidScheduleError, id="max_attempts-over-int4"),
    pytest.param({"lease": timedelta(0)}, InvalidScheduleError, id="lease-zero"),
    pytest.param({"lease": timedelta(seconds=-5)}, InvalidScheduleError, id="lease-negative"),
    pytest.param({"lease": 30}, InvalidScheduleError, id="lease-int"),
    pytest.param({"lease": 30.0}, InvalidScheduleError, id="lease-float"),
]


_order_ids = itertools.count(1)


def _refused(
    engine: sa.Engine,
    sent_sql: list[str],
    attempts: list[Callable[[Session], object]],
    expected: type[Exception],
) -> None:
    """Each attempt raises ``expected`` in an open transaction, sends nothing, and leaves the
    transaction usable: a business row inserted afterwards commits."""
    mine = [next(_order_ids), next(_order_ids)]
    with Session(engine) as session:
        session.execute(sa.insert(orders_table), {"id": mine[0], "note": "before"})
        before = len(sent_sql)
        for attempt in attempts:
            with pytest.raises(expected) as raised:
                attempt(session)
            assert type(raised.value) is expected
            assert isinstance(raised.value, JobQueueError)
            assert sent_sql[before:] == [], "SQL was sent for a job that was refused"
            assert session.in_transaction()
        session.execute(sa.insert(orders_table), {"id": mine[1], "note": "after"})
        session.commit()
    with engine.connect() as conn:
        committed = conn.execute(
            select(orders_table.c.note).where(orders_table.c.id.in_(mine)).order_by("id")
        ).scalars()
        assert list(committed) == ["before", "after"]
    assert count(engine) == 0


@pytest.mark.parametrize("payload", BAD_PAYLOADS)
def test_bad_payload_is_refused_before_any_sql(
    shared_engine: sa.Engine, queue: JobQueue, shared_sql: list[str], payload: Any
) -> None:
    _refused(
        shared_engine,
        shared_sql,
        [
            lambda s: queue.enqueue(s, "work_a", payload),
            # One bad payload among good ones rejects the whole batch.
            lambda s: queue.enqueue_many(s, "work_a", [{"ok": 1}, payload, {"ok": 2}]),
            lambda s: queue.enqueue_many(s, "work_a", [payload]),
        ],
        PayloadError,
    )


@pytest.mark.parametrize(("options", "expected"), BAD_OPTIONS)
def test_bad_option_is_refused_before_any_sql(
    shared_engine: sa.Engine,
    queue: JobQueue,
    shared_sql: list[str],
    options: dict[str, Any],
    expected: type[Exception],
) -> None:
    options = dict(options)
    task = options.pop("task", "work_a")
    _refused(
        shared_engine,
        shared_sql,
        [
            lambda s: queue.enqueue(s, task, {"n": 1}, **options),
            lambda s: queue.enqueue_many(s, task, [{"n": 1}, {"n": 2}], **options),
        ],
        expected,
    )


def test_payload_size_limit_counts_utf8_bytes(tables: sa.Engine, sent_sql: list[str]) -> None:
    queue = make_queue(max_payload_bytes=50)
    # {"s":"..."} is 8 bytes of JSON around the string; "é" is two bytes in UTF-8.
    at_limit = {"s": "é" * 21}  # 50 bytes, 29 characters
    over_limit = {"s": "é" * 22}  # 52 bytes, 30 characters
    _refused(
        tables,
        sent_sql,
        [
            lambda s: queue.enqueue(s, "work_a", over_limit),
            lambda s: queue.enqueue_many(s, "work_a", [at_limit, over_limit]),
        ],
        PayloadError,
    )
    with Session(tables) as session, session.begin():
        ids = [queue.enqueue(session, "work_a", at_limit)]
        ids += queue.enqueue_many(session, "work_a", [at_limit, {"s": "x"}])
    assert [job(tables, i).payload for i in ids] == [at_limit, at_limit, {"s": "x"}]


def test_default_payload_limit_is_one_megabyte(tables: sa.Engine, sent_sql: list[str]) -> None:
    queue = make_queue()
    assert queue.max_payload_bytes == 1_000_000
    _refused(
        tables,
        sent_sql,
        [lambda s: queue.enqueue(s, "work_a", "x" * 1_000_000)],  # plus two quotes
        PayloadError,
    )


# -- 6. scheduling --------------------------------------------------------------------------


def _now(session: Session | sa.Connection) -> datetime:
    now = session.execute(select(func.now())).scalar_one()
    assert isinstance(now, datetime)
    return now


def _after(later: datetime, earlier: datetime) -> timedelta:
    """The elapsed time between two aware datetimes, whatever their tzinfo."""
    return later.astimezone(UTC) - earlier.astimezone(UTC)


def test_run_at_delay_counts_from_database_now(engine: sa.Engine, queue: JobQueue) -> None:
    delay = timedelta(minutes=5, seconds=3, microseconds=250)
    with Session(engine) as session, session.begin():
        now = _now(session)
        due_now = queue.enqueue(session, "work_a", {"n": 0})
        delayed = queue.enqueue(session, "work_a", {"n": 1}, run_at=delay)
        batch = queue.enqueue_many(session, "work_a", [{"n": 2}, {"n": 3}], run_at=delay)
        assert info(queue, session, due_now).visible_at == now
        for job_id in [delayed, *batch]:
            assert _after(info(queue, session, job_id).visible_at, now) == delay
            assert info(queue, session, job_id).created_at == now
    with engine.connect() as conn:
        queue.enqueue(conn, "work_a", {"n": 4}, run_at=delay)
        now = _now(conn)
        last = queue.enqueue(conn, "work_a", {"n": 5}, run_at=delay)
        assert _after(info(queue, conn, last).visible_at, now) == delay
        conn.rollback()


# -- 7. the task registry -------------------------------------------------------------------
