"""Test fixtures: a real PostgreSQL server, and databases on it migrated from one template.

The server is chosen in this order:

1. ``SA_JOBQUEUE_TEST_DATABASE_URL``: an existing server (the URL of a database on it that the
   tests may connect to; they create and drop databases named ``sajq_*`` beside it);
2. a testcontainers PostgreSQL, when a Docker engine answers;
3. an embedded server from the ``pgserver`` wheel, in a temporary directory.

Nothing here starts before a test asks for a database: the unit tier (tests/unit) never does.
The template database is migrated once with our Alembic revisions. The integration tier
(tests/integration/conftest.py) clones it once and rolls each test back; each test that asks
for ``database_url`` here gets its own copy, so the acceptance and migration tiers can commit,
LISTEN and run worker processes without seeing each other's rows.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy.engine import URL

from sa_jobqueue import JobQueue
from sa_jobqueue.database import create_engine, normalise_url
from sa_jobqueue.migrations import upgrade
from tests.helpers.databases import cloned_database, drop_database, recreate_database

TIERS = ("unit", "integration", "acceptance", "migrations")


def pytest_configure(config: pytest.Config) -> None:
    """Draw the model checker's random seed for this run (tests/model/test_model.py), unless
    given: once, before pytest-xdist starts its processes, which inherit it and so collect the
    same tests."""
    os.environ.setdefault("SA_JOBQUEUE_MODEL_SEED", str(random.randrange(2**31)))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its tier, the directory it is in under tests/."""
    root = Path(__file__).parent
    for item in items:
        parts = item.path.relative_to(root).parts if item.path.is_relative_to(root) else ()
        if parts and parts[0] in TIERS:
            item.add_marker(parts[0])


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


@pytest.fixture(scope="session")
def template_database(server_url: URL) -> Iterator[str]:
    """A database migrated to our newest revision, to clone for each test."""
    name = f"sajq_template_{os.getpid()}"
    engine = create_engine(recreate_database(server_url, name), poolclass=sa.pool.NullPool)
    upgrade(engine)
    engine.dispose()
    yield name
    drop_database(server_url, name)


@pytest.fixture
def database_url(server_url: URL, template_database: str) -> Iterator[URL]:
    """A fresh database of this test's own, with the schema installed."""
    with cloned_database(server_url, template_database) as url:
        yield url


@pytest.fixture
def empty_database_url(server_url: URL) -> Iterator[URL]:
    """A fresh database of this test's own, without our schema."""
    with cloned_database(server_url, "template0") as url:
        yield url


@pytest.fixture
def engine(database_url: URL) -> Iterator[sa.Engine]:
    engine = create_engine(database_url, pool_size=20, max_overflow=5)
    yield engine
    engine.dispose()


@pytest.fixture
def queue() -> JobQueue:
    """A queue with no tasks yet (a module that needs tasks declared up front has its own)."""
    return JobQueue()


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    """Collects the spans of a tracing test, in memory."""
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    """A tracer provider of the test's own, exporting to ``exporter``."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()
