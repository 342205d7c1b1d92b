"""How enqueue reaches the database: round trips, straight to psycopg or through SQLAlchemy.

One job is one INSERT, sent to psycopg directly unless something listens to SQLAlchemy's
events. Round trips are counted in libpq's protocol trace (see tests/helpers/protocol.py), on
an engine of the test's own that prepares no statements, so that psycopg's one-off preparing
round trip cannot make a count vary.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from sa_jobqueue import JobQueue
from sa_jobqueue._binds import _driver_text
from sa_jobqueue._sql import enqueue as enqueue_sql
from sa_jobqueue.database import create_engine
from tests.helpers.jobs import handler
from tests.helpers.notify import recording
from tests.helpers.protocol import pgconn_of, traced


@pytest.fixture
def queue() -> JobQueue:
    queue = JobQueue(default_queue="paths")
    queue.task(name="plain")(handler)
    queue.task(name="keyed", unique_key=lambda payload: str(payload["k"]))(handler)
    return queue


@pytest.fixture
def own(integration_engine: sa.Engine) -> Iterator[sa.Connection]:
    """A connection of an engine that prepares no statements, in a transaction rolled back."""
    engine = create_engine(integration_engine.url, connect_args={"prepare_threshold": None})
    try:
        with engine.connect() as connection:
            transaction = connection.begin()
            yield connection
            transaction.rollback()
    finally:
        engine.dispose()


@pytest.fixture
def sent_sql(own: sa.Connection) -> Iterator[list[str]]:
    """Every statement ``own``'s engine sends through SQLAlchemy's execute."""
    yield from recording(own.engine)


# -- round trips ---------------------------------------------------------------------------------


def test_an_enqueue_in_an_open_transaction_is_one_round_trip(
    own: sa.Connection, queue: JobQueue
) -> None:
    own.execute(sa.text("SELECT 1"))  # the transaction has begun and done work
    with traced(pgconn_of(own)) as first:
        woke = queue.enqueue(own, "plain", {"n": 1})
    with traced(pgconn_of(own)) as second:
        again = queue.enqueue(own, "plain", {"n": 2})
    assert first.round_trips == 1
    assert "pg_notify" in first.queries[0]  # the wake-up rides in the INSERT
    assert second.round_trips == 1
    assert "pg_notify" not in second.queries[0]  # sent once per transaction
    assert (woke.created, again.created, again > woke) == (True, True, True)


def test_an_enqueue_in_a_session_is_one_round_trip(own: sa.Connection, queue: JobQueue) -> None:
    with Session(bind=own, join_transaction_mode="create_savepoint") as session:
        session.execute(sa.text("SELECT 1"))
        with traced(pgconn_of(own)) as traffic:
            queue.enqueue(session, "plain", {"n": 1})
            queue.enqueue(session, "plain", {"n": 2})
    assert traffic.round_trips == 2


def test_an_enqueue_goes_through_sqlalchemy_when_something_listens(
    own: sa.Connection, queue: JobQueue, sent_sql: list[str]
) -> None:
    own.execute(sa.text("SELECT 1"))
    before = len(sent_sql)
    with traced(pgconn_of(own)) as traffic:
        queue.enqueue(own, "plain", {"n": 1})
    statements = sent_sql[before:]
    assert len(statements) == 1  # seen by the listener: it went through SQLAlchemy's execute
    assert statements[0].startswith("INSERT")
    assert "pg_notify" in statements[0]
    assert traffic.round_trips == 1


def test_the_single_inserts_are_sent_as_sqlalchemy_would(own: sa.Connection) -> None:
    # The direct path needs no conversion of values by SQLAlchemy: if a statement ever needed
    # one, its driver text would be None and enqueue would quietly take the slower path.
    for schedule in ("now", "at", "after"):
        for flags in range(16):
            wake, unique, traced_, backoff = (bool(flags & bit) for bit in (1, 2, 4, 8))
            statement = enqueue_sql.insert_job(schedule, wake, unique, traced_, backoff)
            text = _driver_text(statement, own.dialect)
            assert text is not None, (schedule, wake, unique, traced_, backoff)
            assert text.text == str(statement.compile(dialect=own.dialect))
