"""The acceptance tier: each test has a fresh database of its own, cloned from the template.

Here the tests commit, LISTEN, open many connections, run workers (in threads or as
``sa-jobqueue worker`` subprocesses), send signals and put poolers in between. A module names
what it needs at module level, and the fixtures below read it:

- ``TABLES``: the module's own tables (a MetaData, or the DDL of one table), created in the
  test's database by ``db`` and ``tables``;
- ``WORKER_APP``: the :class:`~tests.helpers.processes.WorkerApp` that ``workers`` starts.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL

from sa_jobqueue.database import create_engine
from tests.helpers.notify import listening, recording
from tests.helpers.processes import WorkerApp, Workers


def _create_tables(engine: sa.Engine, request: pytest.FixtureRequest) -> None:
    tables = getattr(request.module, "TABLES", None)
    if isinstance(tables, sa.MetaData):
        tables.create_all(engine)
    elif tables is not None:
        with engine.begin() as conn:
            conn.exec_driver_sql(tables)


@pytest.fixture
def db(database_url: URL, request: pytest.FixtureRequest) -> Iterator[sa.Engine]:
    """An engine with a pool large enough for ten in-process workers, and the module's TABLES."""
    engine = create_engine(database_url, pool_size=40, max_overflow=10)
    _create_tables(engine, request)
    yield engine
    engine.dispose()


@pytest.fixture
def tables(engine: sa.Engine, request: pytest.FixtureRequest) -> sa.Engine:
    """The test's ``engine``, with the module's TABLES (what its task module writes) created."""
    _create_tables(engine, request)
    return engine


@pytest.fixture
def worker_app(request: pytest.FixtureRequest) -> WorkerApp:
    """The task module the test module's worker subprocesses run: its ``WORKER_APP``."""
    app: WorkerApp = request.module.WORKER_APP
    return app


@pytest.fixture
def workers(worker_app: WorkerApp, database_url: URL, tmp_path: Path) -> Iterator[Workers]:
    """Worker subprocesses of the test module's ``WORKER_APP``, killed at the end."""
    started = Workers(worker_app, database_url, tmp_path)
    try:
        yield started
    finally:
        started.kill_all()


@pytest.fixture
def sent_sql(engine: sa.Engine) -> Iterator[list[str]]:
    """Every statement the test's ``engine`` sends to the server, in order."""
    yield from recording(engine)


@pytest.fixture
def listener(engine: sa.Engine) -> Iterator[psycopg.Connection[Any]]:
    """A plain psycopg connection to the test's database that LISTENs on the queue's channel."""
    with listening(engine) as conn:
        yield conn
