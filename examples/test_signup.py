"""Testing tasks with sa_jobqueue.testing: assert on enqueued jobs, run a handler, drain the queue.

pytest examples/test_signup.py   # uses DATABASE_URL, else an embedded PostgreSQL server

Two kinds of test, two fixtures:

* ``session``: everything happens in one transaction that is rolled back at the end. Enough to
  check what was enqueued (``assert_enqueued``, ``refute_enqueued``) and what a handler writes
  (``run_task``), and nothing is left behind.
* ``engine``: the test commits, as the application does, and the tables are emptied
  afterwards. ``drain`` needs that: the worker runs each job in a transaction of its own,
  which sees only committed rows.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _database import database_url
from outbox import Base, User, WelcomeEmail, queue, send_welcome
from signup import sign_up
from sqlalchemy import Engine, delete, select
from sqlalchemy.orm import Session

from sa_jobqueue.database import create_engine
from sa_jobqueue.migrations import upgrade
from sa_jobqueue.models import jobs_table
from sa_jobqueue.testing import assert_enqueued, drain, refute_enqueued, run_task


@pytest.fixture(scope="module")
def database() -> Iterator[Engine]:
    with database_url("sajq_test_signup") as url:
        engine = create_engine(url)
        upgrade(engine)  # sa_jobqueue's table
        Base.metadata.create_all(engine)  # the application's
        yield engine
        engine.dispose()


@pytest.fixture
def session(database: Engine) -> Iterator[Session]:
    """A Session whose work is all rolled back after the test (its commits are savepoints)."""
    with database.connect() as conn:
        transaction = conn.begin()
        with Session(bind=conn, join_transaction_mode="create_savepoint") as session:
            yield session
        transaction.rollback()


@pytest.fixture
def engine(database: Engine) -> Iterator[Engine]:
    """For tests that commit: the rows they leave are deleted afterwards."""
    yield database
    with database.begin() as conn:
        for table in (WelcomeEmail.__table__, User.__table__, jobs_table):
            conn.execute(delete(table))


def test_sign_up_enqueues_the_welcome_email(session: Session) -> None:
    user = sign_up(session, "ada@example.com")

    # Seen before any commit: the helpers read the jobs table in the test's own transaction.
    job = assert_enqueued(session, task=send_welcome, payload={"user_id": user.id})
    assert job.queue == "default"


def test_a_sign_up_rolled_back_enqueues_nothing(session: Session) -> None:
    savepoint = session.begin_nested()
    sign_up(session, "grace@example.com")
    savepoint.rollback()  # the rest of the sign-up failed: the user goes, and so does the job

    refute_enqueued(session, task=send_welcome)


def test_send_welcome_writes_the_email(session: Session) -> None:
    user = User(email="ada@example.com")
    session.add(user)
    session.flush()

    # The handler runs here and now, its ctx.session writing into the test's transaction.
    run_task(send_welcome, {"user_id": user.id}, session=session)

    email = session.scalars(select(WelcomeEmail)).one()
    assert (email.user_id, email.subject) == (user.id, "Welcome, ada@example.com")


def test_a_committed_sign_up_gets_its_email(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        user_id = sign_up(session, "ada@example.com").id

    result = drain(queue, engine)  # every due job, run by a real worker, then back here

    assert (result.succeeded, result.failed, result.dead) == (1, 0, 0), result
    with Session(engine) as session:
        email = session.scalars(select(WelcomeEmail)).one()
    assert email.user_id == user_id
