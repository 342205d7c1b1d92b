"""The integration tier: each test runs in one transaction that is rolled back after it.

The whole tier shares one database, cloned from the migrated template once per session. A test
gets ``conn``, a Connection whose transaction is begun for it, and/or ``session``, a Session
bound to that connection with ``join_transaction_mode="create_savepoint"``: the code under test
may call ``session.commit()`` (it releases a savepoint), and nothing the test wrote outlives it.

What belongs elsewhere: a test that needs its writes committed, NOTIFY delivered, another
connection to see or wait on its rows, or a worker (which opens connections of its own) goes to
tests/acceptance. A test that commits ``conn`` itself fails here, since it would leave its rows
to the tests after it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sa_jobqueue.database import create_engine
from tests.helpers.databases import cloned_database


@pytest.fixture(scope="session")
def integration_engine(server_url: URL, template_database: str) -> Iterator[sa.Engine]:
    """An engine on the tier's one database (what it reads is committed: nothing, normally)."""
    with cloned_database(server_url, template_database, prefix="sajq_i") as url:
        engine = create_engine(url)
        yield engine
        engine.dispose()


@pytest.fixture
def conn(integration_engine: sa.Engine) -> Iterator[sa.Connection]:
    """A connection in a transaction that is rolled back after the test."""
    with integration_engine.connect() as connection:
        transaction = connection.begin()
        yield connection
        assert transaction.is_active, "the test ended its transaction: it belongs in acceptance"
        transaction.rollback()


@pytest.fixture
def session(conn: sa.Connection) -> Iterator[Session]:
    """A Session on ``conn``'s transaction; its commits release savepoints inside it."""
    with Session(bind=conn, join_transaction_mode="create_savepoint") as session:
        yield session


@pytest.fixture(scope="module", autouse=True)
def tables(integration_engine: sa.Engine, request: pytest.FixtureRequest) -> sa.Engine:
    """The tier's engine, with the test module's ``TABLES`` (a MetaData) created in its database.

    Created once and committed, since a table made inside a test's transaction would be gone
    for any other connection; the rows the tests write are still rolled back.
    """
    metadata = getattr(request.module, "TABLES", None)
    if metadata is not None:
        metadata.create_all(integration_engine, checkfirst=True)
    return integration_engine
