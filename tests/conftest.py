"""Test fixtures: a real PostgreSQL server, and a fresh database per test cloned from a template.

The server is chosen in this order:

1. ``SA_JOBQUEUE_TEST_DATABASE_URL``: an existing server (the URL of a database on it that the
   tests may connect to; they create and drop databases named ``sajq_*`` beside it);
2. a testcontainers PostgreSQL, when a Docker engine answers;
3. an embedded server from the ``pgserver`` wheel, in a temporary directory.

The template database is migrated once with our Alembic revisions; each test that asks for
``database_url`` gets its own copy, so tests can commit, LISTEN and run worker processes
without seeing each other's rows.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL

from sa_jobqueue.database import create_engine, normalise_url
from sa_jobqueue.migrations import upgrade
from tests.workers import WorkerApp, Workers


def _docker_answers() -> bool:
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if host.startswith("unix://") and not os.path.exists(host.removeprefix("unix://")):
        return False  # no engine here; skip the client, which would leak a socket on failure
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            import docker

            client = docker.from_env(timeout=3)
            try:
                return bool(client.ping())
            finally:
                client.close()
        except Exception:
            return False


@pytest.fixture(scope="session")
def server_url() -> Iterator[URL]:
    """An administrative URL for a PostgreSQL server the tests may create databases on."""
    configured = os.environ.get("SA_JOBQUEUE_TEST_DATABASE_URL")
    if configured:
        yield normalise_url(configured)
        return
    if _docker_answers():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:16-alpine", driver="psycopg") as container:
            yield normalise_url(container.get_connection_url())
        return
    import pgserver

    # Not under pytest's temporary root: as root, pgserver runs the server as another user and
    # opens the data directory's parents to it, and every later pytest run locks that root
    # down again, which would cut a concurrently running server off from its files.
    datadir = tempfile.mkdtemp(prefix="sajq-pgdata-")
    server = pgserver.get_server(datadir, cleanup_mode="stop")
    try:
        yield normalise_url(server.get_uri())
    finally:
        server.cleanup()
        shutil.rmtree(datadir, ignore_errors=True)


def _admin(url: URL) -> sa.Engine:
    return create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)


@pytest.fixture(scope="session")
def template_database(server_url: URL) -> Iterator[str]:
    """A database migrated to our newest revision, to clone for each test."""
    name = f"sajq_template_{os.getpid()}"
    admin = _admin(server_url)
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    engine = create_engine(server_url.set(database=name), poolclass=sa.pool.NullPool)
    upgrade(engine)
    engine.dispose()
    yield name
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


_counter = itertools.count()


def _new_database(server_url: URL, template: str) -> Iterator[URL]:
    name = f"sajq_t{os.getpid()}_{next(_counter)}"
    admin = _admin(server_url)
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
    try:
        yield server_url.set(database=name)
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def database_url(server_url: URL, template_database: str) -> Iterator[URL]:
    """A fresh database of this test's own, with the schema installed."""
    yield from _new_database(server_url, template_database)


@pytest.fixture
def empty_database_url(server_url: URL) -> Iterator[URL]:
    """A fresh database of this test's own, without our schema."""
    yield from _new_database(server_url, "template0")


@pytest.fixture
def engine(database_url: URL) -> Iterator[sa.Engine]:
    engine = create_engine(database_url, pool_size=20, max_overflow=5)
    yield engine
    engine.dispose()


def url_string(url: URL) -> str:
    """A URL as a string a subprocess can take (password included)."""
    return url.render_as_string(hide_password=False)


@pytest.fixture
def workers(worker_app: WorkerApp, database_url: URL, tmp_path: Path) -> Iterator[Workers]:
    """Worker subprocesses of the test module's ``worker_app`` fixture, killed at the end."""
    started = Workers(worker_app, database_url, tmp_path)
    try:
        yield started
    finally:
        started.kill_all()
