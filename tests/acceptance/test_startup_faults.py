"""Connections cut during their setup, under workers that are starting.

SQLAlchemy asks the server for its version and settings on the first connection an engine
opens (the dialect's setup), through a connection of its own. A pooler or server restarting
just then closes that connection right after the handshake, at the setup's first query: a
worker starting must take that as the lost connection it is, connect again (within its
startup bounds) and start; one whose database stays out of reach exits with one line.

The cut is :class:`~tests.helpers.poolers.SilentProxy`'s ``cut_next_once_ready``: a starting
CLI worker opens its ``--wait-for-database`` ping's connection first, then the schema check's
(the first connection of the worker's own engine), so ``skip`` picks which one is cut.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sa_jobqueue import Worker
from sa_jobqueue._binds import transient
from sa_jobqueue.database import create_engine, ping
from sa_jobqueue.errors import DatabaseUnavailableError
from tests.apps import network
from tests.helpers.jobs import statuses
from tests.helpers.poolers import PGBOUNCER, SilentProxy, pgbouncer
from tests.helpers.processes import WorkerApp, Workers

APP = WorkerApp("tests.apps.network:queue", log_level="INFO")
TABLES = network.metadata

needs_pgbouncer = pytest.mark.skipif(
    PGBOUNCER is None, reason="pgbouncer is not installed (Debian package pgbouncer)"
)

#: Where the workers connect: straight to the server, or through PgBouncer in transaction
#: mode (``--pooler transaction``); either way through the cutting proxy.
POOLERS = ["session", pytest.param("transaction", marks=needs_pgbouncer)]
#: The CLI worker's connections, in the order it opens them.
PING, SCHEMA_CHECK = 0, 1


def enqueue(url: URL, task: str, n: int) -> list[int]:
    engine = create_engine(url)
    try:
        with Session(engine) as session, session.begin():
            return [int(i) for i in network.queue.enqueue_many(session, task, [{}] * n)]
    finally:
        engine.dispose()


@contextlib.contextmanager
def cutting_proxy(database_url: URL, pooler: str) -> Iterator[SilentProxy]:
    """A proxy to the test database, or to a PgBouncer in transaction mode in front of it."""
    with contextlib.ExitStack() as stack:
        upstream = database_url
        if pooler == "transaction":
            upstream = stack.enter_context(pgbouncer(database_url, "transaction")).url(upstream)
        proxy = SilentProxy(upstream)
        stack.callback(proxy.close)
        yield proxy


#: Which of the dialect's setup queries is cut, by how many the server answered before it
#: (SQLAlchemy 2.1's order): its first (the server's version; SQLAlchemy swallows the
#: NotImplementedError a broken hook raised there, and went on to "This Connection is
#: closed"), or ``show standard_conforming_strings`` (the NotImplementedError came out bare).
SETUP_QUERIES = {"version": 0, "standard-conforming-strings": 4}


@pytest.mark.parametrize("answered", SETUP_QUERIES.values(), ids=SETUP_QUERIES.keys())
def test_a_worker_whose_first_connection_is_cut_during_its_setup_starts_all_the_same(
    tables: sa.Engine, database_url: URL, answered: int
) -> None:
    """In-process, on an engine of the application's own (``sqlalchemy.create_engine``): the
    worker's statement deadline hooks the engine's errors, and the first connection is cut
    during the dialect's setup. The schema check connects again and the burst runs its jobs."""
    ids = enqueue(database_url, "write", 2)
    proxy = SilentProxy(database_url)
    engine = sa.create_engine(proxy.url(database_url).set(drivername="postgresql+psycopg"))
    proxy.cut_next_once_ready(1, answered=answered)
    try:
        worker = Worker(network.queue, engine, concurrency=2, poll_interval=timedelta(seconds=0.2))
        assert worker.run(burst=True)
    finally:
        engine.dispose()
        proxy.close()
    assert statuses(tables, ids) == {"succeeded": 2}


@pytest.mark.slow
@pytest.mark.parametrize("pooler", POOLERS)
@pytest.mark.parametrize("cut", [PING, SCHEMA_CHECK], ids=["ping", "schema-check"])
def test_a_burst_whose_connection_is_cut_during_its_setup_starts_all_the_same(
    tables: sa.Engine, database_url: URL, tmp_path: Path, pooler: str, cut: int
) -> None:
    """``sa-jobqueue worker --burst``: the ping's connection (tried again within
    ``--wait-for-database``) or the schema check's (tried again for a few seconds) is cut
    during its setup; the worker connects again, runs its job and exits 0."""
    (job_id,) = enqueue(database_url, "write", 1)
    with cutting_proxy(database_url, pooler) as proxy:
        proxy.cut_next_once_ready(1, skip=cut)
        workers = Workers(APP, proxy.url(database_url), tmp_path)
        try:
            burst = workers.start(
                "--burst", "--wait-for-database", "10", "--pooler", pooler, concurrency=1
            )
            code = workers.wait_exit(burst, timeout=40)
            assert code == 0, workers.output(burst)
        finally:
            workers.kill_all()
    assert statuses(tables, [job_id]) == {"succeeded": 1}


@pytest.mark.slow
@pytest.mark.parametrize("pooler", POOLERS)
def test_a_worker_whose_schema_check_connection_is_cut_during_its_setup_serves(
    tables: sa.Engine, database_url: URL, tmp_path: Path, pooler: str
) -> None:
    """A worker that is not a burst: started with its first own connection cut during its
    setup, it stays up and runs a job enqueued afterwards."""
    with cutting_proxy(database_url, pooler) as proxy:
        proxy.cut_next_once_ready(1, skip=SCHEMA_CHECK)
        workers = Workers(APP, proxy.url(database_url), tmp_path)
        try:
            workers.start("--pooler", pooler, concurrency=1)
            ids = enqueue(database_url, "write", 1)
            workers.wait(lambda: statuses(tables, ids) == {"succeeded": 1}, timeout=40)
            workers.terminate_all()
        finally:
            workers.kill_all()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("cut", "options", "says"),
    [
        (PING, ("--wait-for-database", "2"), "sa-jobqueue: cannot connect to "),
        (SCHEMA_CHECK, (), "sa-jobqueue: cannot check the schema: "),
    ],
    ids=["ping", "schema-check"],
)
def test_a_worker_whose_connections_are_all_cut_during_their_setup_exits_with_one_line(
    database_url: URL, tmp_path: Path, cut: int, options: tuple[str, ...], says: str
) -> None:
    """Every connection (past ``cut``) is cut during its setup: once its startup bounds are
    spent, the worker exits 1 saying why in one line, with no traceback."""
    proxy = SilentProxy(database_url)
    proxy.cut_next_once_ready(10_000, skip=cut)
    workers = Workers(APP, proxy.url(database_url), tmp_path)
    try:
        burst = workers.start("--burst", *options, concurrency=1)
        assert workers.wait_exit(burst, timeout=60) == 1
        output = workers.output(burst)
        assert "Traceback" not in output, output
        errors = [line for line in output.splitlines() if line.startswith("sa-jobqueue: ")]
        assert errors[-1].startswith(says), output
    finally:
        workers.kill_all()
        proxy.close()


def test_a_checkout_that_runs_out_of_fresh_connections_is_a_transient_fault(
    database_url: URL,
) -> None:
    """The pool pings a connection at checkout and replaces one that fails, twice; when the
    replacement fails too, SQLAlchemy gives up with ``InvalidRequestError("This connection is
    closed")``. That is a lost connection, not a mistake in the caller's code: transient, and
    the ping says the database is unavailable."""
    proxy = SilentProxy(database_url)
    engine = create_engine(proxy.url(database_url), connect_args={"application_name": "pooled"})
    try:
        with engine.connect() as conn:  # the dialect's setup done; one connection in the pool
            conn.execute(sa.text("SELECT 1"))
        _terminate(database_url, "pooled")  # the pooled connection fails its ping...
        proxy.cut_next_once_ready(2)  # ...and so does its replacement
        with pytest.raises(sa.exc.InvalidRequestError) as raised:
            engine.connect()
        assert transient(raised.value)
        # The pool is empty now: a fresh connection fails its ping, and its replacement too.
        proxy.cut_next_once_ready(2)
        with pytest.raises(DatabaseUnavailableError):
            ping(engine)
    finally:
        engine.dispose()
        proxy.close()


def test_a_connection_cut_during_its_setup_under_an_applications_error_hook_is_lost(
    database_url: URL,
) -> None:
    """The application hooks its engine's errors, reading the connection's ``info`` as hooks
    do; on the engine's first connection that raises NotImplementedError, which replaces the
    driver's error, and SQLAlchemy's setup goes on over the closed connection. The connect
    fails as a lost connection all the same: transient, and unavailable to the ping; the
    next connection sets the engine up."""
    proxy = SilentProxy(database_url)
    engine = create_engine(proxy.url(database_url))
    seen: list[object] = []

    @sa.event.listens_for(engine, "handle_error")
    def note(context: sa.engine.ExceptionContext) -> None:
        if context.connection is not None:
            seen.append(context.connection.info.get("request"))

    try:
        proxy.cut_next_once_ready(1)
        with pytest.raises(sa.exc.SQLAlchemyError) as raised:
            engine.connect()
        assert transient(raised.value), repr(raised.value)
        proxy.cut_next_once_ready(1)
        with pytest.raises(DatabaseUnavailableError):
            ping(engine)
        ping(engine)  # the next connection is not cut: the setup runs again, and succeeds
    finally:
        engine.dispose()
        proxy.close()


def _terminate(database_url: URL, application: str) -> None:
    admin = create_engine(database_url)
    try:
        with admin.connect() as conn:
            conn.execute(
                sa.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND application_name = :app"
                ),
                {"app": application},
            )
    finally:
        admin.dispose()


def _reading_info_on_errors(engine: sa.Engine) -> None:
    """An application's ``handle_error`` hook that reads the failed connection's ``info``, as
    hooks do: on the Connection SQLAlchemy sets an engine up with, that raises
    NotImplementedError, which replaces the driver's error."""

    @sa.event.listens_for(engine, "handle_error")
    def note(context: sa.engine.ExceptionContext) -> None:
        if context.connection is not None:
            context.connection.info.get("request")


@pytest.mark.parametrize("pooler", ["direct", pytest.param("transaction", marks=needs_pgbouncer)])
def test_this_connection_is_closed_after_a_cut_during_the_setup_is_transient(
    database_url: URL, pooler: str
) -> None:
    """On an application's own engine (``sqlalchemy.create_engine``, so without
    :func:`~sa_jobqueue.database.guard_dialect_setup`) under such a hook, a connection cut
    during the dialect's setup (a PgBouncer or server restarting as it connects) fails the
    connect with SQLAlchemy's ``ResourceClosedError("This Connection is closed")``: the setup
    went on over the connection the cut closed. That is a lost connection: transient."""
    with cutting_proxy(database_url, "session" if pooler == "direct" else pooler) as proxy:
        url = proxy.url(database_url).set(drivername="postgresql+psycopg")
        engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        _reading_info_on_errors(engine)
        try:
            proxy.cut_next_once_ready(1)
            with pytest.raises(sa.exc.ResourceClosedError) as raised:
                engine.connect()
            assert str(raised.value) == "This Connection is closed"
            assert transient(raised.value)
        finally:
            engine.dispose()


def test_this_connection_is_closed_for_a_connection_the_caller_closed_is_a_mistake(
    database_url: URL,
) -> None:
    """The same class and text for a Connection the calling code closed, whichever call
    meets it (a statement, ``invalidate()``, ``detach()``), and the pool's text raised outside
    the pool: mistakes in the calling code, never retried."""
    engine = sa.create_engine(database_url.set(drivername="postgresql+psycopg"))
    try:
        conn = engine.connect()
        conn.close()
        for use in (lambda: conn.execute(sa.text("SELECT 1")), conn.invalidate, conn.detach):
            with pytest.raises(sa.exc.ResourceClosedError) as raised:
                use()
            assert str(raised.value) == "This Connection is closed"
            assert not transient(raised.value)
        with pytest.raises(sa.exc.InvalidRequestError) as mistaken:
            raise sa.exc.InvalidRequestError("This connection is closed")
        assert not transient(mistaken.value)
    finally:
        engine.dispose()


def test_a_worker_on_an_applications_hooked_engine_whose_setup_is_cut_starts_all_the_same(
    tables: sa.Engine, database_url: URL
) -> None:
    """In-process, on an application's engine with such a hook: the first connection is cut
    at the setup's first query; the schema check connects again and the burst runs its jobs,
    instead of raising "This Connection is closed"."""
    ids = enqueue(database_url, "write", 2)
    proxy = SilentProxy(database_url)
    engine = sa.create_engine(proxy.url(database_url).set(drivername="postgresql+psycopg"))
    _reading_info_on_errors(engine)
    proxy.cut_next_once_ready(1, answered=SETUP_QUERIES["version"])
    try:
        worker = Worker(network.queue, engine, concurrency=2, poll_interval=timedelta(seconds=0.2))
        assert worker.run(burst=True)
    finally:
        engine.dispose()
        proxy.close()
    assert statuses(tables, ids) == {"succeeded": 2}


def test_an_enqueue_on_an_applications_hooked_engine_whose_setup_is_cut_is_tried_again(
    tables: sa.Engine, database_url: URL
) -> None:
    """A producer's ``enqueue(engine)`` (a transaction of its own) on such an engine, whose
    first connection is cut during its setup: tried again, the job is enqueued once."""
    proxy = SilentProxy(database_url)
    engine = sa.create_engine(proxy.url(database_url).set(drivername="postgresql+psycopg"))
    _reading_info_on_errors(engine)
    proxy.cut_next_once_ready(1)
    try:
        job = network.queue.enqueue(engine, "write", {})
    finally:
        engine.dispose()
        proxy.close()
    assert statuses(tables, [int(job)]) == {"queued": 1}
