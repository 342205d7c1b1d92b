"""Engines for the worker and the CLI, and the schema check workers run before they start."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any, Literal

import psycopg
import sqlalchemy as sa
from sqlalchemy import Connection, Engine, event, inspect
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, DisconnectionError, SQLAlchemyError

from ._binds import transient
from ._deadlines import CLOCK_OPTION, DEADLINE_OPTION, DEADLINES, PING_DEADLINE, StopClock
from ._driver import driver_rows, text_of
from ._error_text import one_line
from ._pooler import parse_options, set_local_in_every_transaction, set_on_connect
from ._sql import schema as schema_sql
from ._sql import session as session_sql
from .errors import DatabaseUnavailableError, SchemaMissingError, SchemaOutdatedError
from .models import BRANCH_LABEL, SCHEMA_REVISION, jobs_table

#: Where a revision of ours may be recorded: our own table (``sa-jobqueue migrate``), or the
#: application's when our revisions joined its Alembic history.
VERSION_TABLES = ("sa_jobqueue_alembic_version", "alembic_version")
MIGRATE_HINT = "run `sa-jobqueue migrate` (or `alembic upgrade heads` in your Alembic setup)"


def normalise_url(url: str | URL) -> URL:
    """Parse a database URL and make it use psycopg 3, the driver sa_jobqueue runs on.

    Plain ``postgresql://`` and ``postgres://`` (which SQLAlchemy alone would give to psycopg2)
    mean psycopg 3 here, as does ``postgresql+psycopg_async://`` (the same driver). A URL that
    names another driver (``+psycopg2``, ``+asyncpg``, ...) is refused rather than quietly run
    on a driver it did not ask for.
    """
    try:
        parsed = make_url(url)
        parsed.port  # noqa: B018 - a non-numeric port only fails when read
    except (ArgumentError, ValueError):
        raise DatabaseUnavailableError(f"not a database URL: {_redact(url)!r}") from None
    if parsed.get_backend_name() not in ("postgresql", "postgres"):
        raise DatabaseUnavailableError(
            f"sa_jobqueue needs PostgreSQL, not {parsed.get_backend_name()!r}"
        )
    driver = parsed.get_driver_name() if "+" in parsed.drivername else ""
    if driver not in ("", "psycopg", "psycopg_async"):
        raise DatabaseUnavailableError(
            f"the URL names the driver {driver!r}, but sa_jobqueue runs on psycopg 3:"
            f" write it as postgresql+psycopg://... (or postgresql://...)"
        )
    return parsed.set(drivername="postgresql+psycopg")


def _redact(url: str | URL) -> str:
    if isinstance(url, URL):
        return describe(url)
    # A string that would not parse may still hold a password: drop what sits before the @.
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}...@{rest.rsplit('@', 1)[1]}" if "@" in rest else url


#: How long opening a connection may take (seconds, libpq's ``connect_timeout``).
CONNECT_TIMEOUT = 10
#: Connection settings for every connection sa_jobqueue opens.
CONNECT_ARGS: dict[str, Any] = {
    "connect_timeout": CONNECT_TIMEOUT,
    "application_name": "sa_jobqueue",
    # TCP keepalives find a half-open connection (a server or network that vanished without a
    # FIN) after about 30 + 3 * 10 = 60 s instead of the kernel's default of two hours.
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
    # Keepalives only probe an idle connection. A statement sent to a peer that vanished
    # (no FIN, no ACK) is retransmitted for up to 15 minutes by default: with this, the
    # kernel drops the connection once data has gone unacknowledged for 60 s (libpq's
    # tcp_user_timeout, in milliseconds; Linux only, ignored elsewhere). What it cannot see:
    # a middlebox that acknowledges and forwards nothing (the client-side deadlines do).
    "tcp_user_timeout": 60_000,
}
#: Server-side limits for the worker's own statements (claim, lease renewal, outcomes). Each
#: is a single indexed statement that takes milliseconds; anything near these limits is a
#: stuck lock or server, and failing lets the worker retry instead of hanging. They stay below
#: the worker's client-side deadline (:data:`sa_jobqueue._deadlines.STATEMENT_DEADLINE`), so a
#: live server always answers first.
CONTROL_SETTINGS: dict[str, str] = {
    "statement_timeout": "10s",
    "lock_timeout": "5s",
    "idle_in_transaction_session_timeout": "30s",
}

#: How the connections reach PostgreSQL. ``"session"``: directly, or through a pooler that
#: gives each client a server connection of its own for as long as it stays connected
#: (PgBouncer's session mode). ``"transaction"``: through a pooler that hands out a server
#: connection per transaction (PgBouncer's transaction mode, Supabase's pooler port), so
#: nothing may outlive a transaction: no startup options, no prepared statements, no LISTEN,
#: no session-level advisory lock or SET.
Pooler = Literal["session", "transaction"]
POOLERS: tuple[Pooler, ...] = ("session", "transaction")
#: The environment variable the CLI reads its ``--pooler`` default from.
POOLER_ENV = "SA_JOBQUEUE_POOLER"
#: Execution option on the engines :func:`create_engine` makes, recording their pooler.
POOLER_OPTION = "sa_jobqueue_pooler"


def create_engine(
    url: str | URL,
    *,
    pooler: Pooler = "session",
    settings: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> Engine:
    """A SQLAlchemy engine on psycopg 3 with timeouts on connecting and TCP keepalives.

    ``settings`` are server settings (``{"statement_timeout": "10s"}``) for every connection.
    With ``pooler="session"`` (a direct connection, or PgBouncer in session mode) each new
    connection sets them once with ``set_config``; the URL's own ``options``
    (``?options=-csearch_path%3Dapp``) go to the server as given. With
    ``pooler="transaction"`` no setting may outlive a transaction, and a transaction pooler
    refuses startup options (PgBouncer: "unsupported startup parameter: options"): so each
    transaction starts by applying the URL's ``-c`` settings and ``settings`` with
    ``set_config(..., is_local => true)``, which end with it and never reach the pooler's next
    client, and psycopg prepares no statements, since the next transaction may run on another
    server connection.

    A pooled connection is pinged when it is checked out (``pool_pre_ping``, on unless you pass
    ``pool_pre_ping=False``), under a client-side deadline of
    :data:`~sa_jobqueue._deadlines.PING_DEADLINE` seconds: one that was terminated
    (``pg_terminate_backend``, a server or pooler restart) or went silent while it sat in the
    pool is replaced by a fresh one before your first statement, instead of failing it or
    waiting on it for ever. It costs one round trip per checkout. What it does not promise: a
    connection lost *after* checkout still fails the statement that meets the loss.
    """
    if pooler not in POOLERS:
        raise ValueError(f"pooler must be one of {', '.join(POOLERS)}, not {pooler!r}")
    url = normalise_url(url)
    pre_ping = bool(kwargs.pop("pool_pre_ping", True))
    connect_args = {**CONNECT_ARGS, **kwargs.pop("connect_args", {})}
    if pooler == "session":
        engine = sa.create_engine(url, connect_args=connect_args, **kwargs)
        if settings:
            set_on_connect(engine, settings)
    else:
        local = parse_options(
            " ".join(filter(None, [url_options(url), connect_args.pop("options", None)]))
        )
        local.update(settings or {})
        connect_args["prepare_threshold"] = None
        url = url.difference_update_query(["options"])
        engine = sa.create_engine(url, connect_args=connect_args, **kwargs)
        if local:
            set_local_in_every_transaction(engine, local)
    engine.update_execution_options(**{POOLER_OPTION: pooler})
    guard_dialect_setup(engine)
    if pre_ping:
        ping_at_checkout(engine)
    return engine


def guard_dialect_setup(engine: Engine, seconds: float = PING_DEADLINE) -> None:
    """Give the dialect's setup on an engine's first connection a client-side deadline.

    SQLAlchemy asks the server for its version and settings on the first connection an
    engine opens, through a connection no execution event sees: on a silent network that
    would wait for ever, and hang whoever opened it (a worker starting, a producer's first
    enqueue). Past ``seconds`` the socket is cut and the connect fails; the setup runs again
    on the next connection.

    A connection lost during the setup (cut, or closed by a pooler or server restarting) fails
    the connect with the driver's error, or, if a ``handle_error`` hook of the application's
    replaced that error (SQLAlchemy's setup then goes on over the closed connection and fails
    with "This Connection is closed"), with :class:`~sqlalchemy.exc.DisconnectionError`:
    either way a lost connection, which the worker tries again.
    """
    setup = engine.dialect.initialize

    def initialize(connection: Connection) -> None:
        try:
            with DEADLINES.guard(connection.connection.dbapi_connection, seconds):
                setup(connection)
        except DBAPIError:
            raise  # the driver's own error: it says whether the connection was lost
        except Exception as exc:
            # SQLAlchemy closes the setup's Connection once one of its errors is a disconnect;
            # an error other than that one means a hook replaced it (see above).
            if connection.closed:
                raise DisconnectionError(
                    f"the connection was lost while it was set up: {exc}"
                ) from exc
            raise

    engine.dialect.initialize = initialize  # type: ignore[method-assign]


def ping_at_checkout(engine: Engine, seconds: float = PING_DEADLINE) -> None:
    """Ping every connection ``engine``'s pool hands out, with a client-side deadline.

    SQLAlchemy's own ``pool_pre_ping`` waits on the ping as long as the socket stays open,
    which on a silent network is for ever; this one gives up after ``seconds``, and the pool
    then replaces the connection (SQLAlchemy tries three times before it raises).
    """

    @event.listens_for(engine, "checkout")
    def ping(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        try:
            with DEADLINES.guard(dbapi_connection, seconds):
                if dbapi_connection.autocommit:
                    dbapi_connection.execute(";")  # an empty query: one round trip
                else:
                    # Outside a transaction: psycopg would open one for the ping.
                    dbapi_connection.autocommit = True
                    try:
                        dbapi_connection.execute(";")
                    finally:
                        if not dbapi_connection.closed:
                            dbapi_connection.autocommit = False
        except Exception as exc:
            # The pool discards the connection and tries a fresh one.
            raise DisconnectionError(str(exc)) from exc


def pooler_of(engine: Engine) -> Pooler:
    """The pooler an engine was made for by :func:`create_engine` (``"session"`` otherwise)."""
    return as_pooler(engine.get_execution_options().get(POOLER_OPTION))


def as_pooler(value: object) -> Pooler:
    """``"transaction"`` if ``value`` says so, else ``"session"``, the default."""
    return "transaction" if value == "transaction" else "session"


#: The worker's own connections that are not one per job thread: the claim loop's and the
#: completer's (each held for good), the heartbeat's, the registry's, and the main thread's
#: (the startup check, the hand-backs at shutdown).
CONTROL_USERS = 5


def create_control_engine(
    url: str | URL, concurrency: int, *, pooler: Pooler = "session"
) -> Engine:
    """The engine for a worker's own statements: autocommit, with statement timeouts.

    Handlers get an engine without these limits: how long their queries may run is the
    application's business. A pooled connection is pinged at checkout under a client-side
    deadline (:mod:`sa_jobqueue._deadlines`), so one that went silent while it sat in the
    pool is replaced, not waited on (as :func:`create_engine` does for every engine).
    """
    engine = create_engine(
        url,
        pooler=pooler,
        settings=CONTROL_SETTINGS,
        isolation_level="AUTOCOMMIT",
        # Every user at once, plus one per job thread recording an outcome: none ever waits
        # for the pool, a wait no statement deadline would cut.
        pool_size=CONTROL_USERS,
        max_overflow=concurrency,
    )
    return engine


def url_options(url: URL) -> str | None:
    """The URL's own libpq ``options`` text (``?options=...``), if it has any."""
    given = url.query.get("options")
    return " ".join(given) if isinstance(given, tuple) else given


class HeldConnection:
    """One autocommit connection a worker thread keeps between its statements.

    The claim loop and the completer run a statement every few milliseconds under load; taking
    a pooled connection for each would add a checkout and, with pre-ping, a round trip. After
    any error the connection is dropped, and the next statement connects afresh.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._conn: Connection | None = None

    def rows(
        self,
        statement: sa.Executable,
        params: dict[str, Any],
        *,
        again: bool = False,
        as_text: bool = False,
    ) -> list[Any]:
        """Run one statement and fetch all its rows.

        With ``again``, a statement whose connection was lost (dropped by the server, or cut
        at its deadline) runs once more on a fresh one: for statements that are safe to repeat.

        With ``as_text``, the statement goes as the text and constants SQLAlchemy would send
        (compiled once), and neither compiling nor the statement's result types are looked at
        again. Only for statements whose values and rows need no processing of SQLAlchemy's
        (the plain claim's); one it cannot send so, or a connection with a
        ``schema_translate_map``, goes through ``execute``. On a worker's own statements'
        engine behind no transaction pooler (see :func:`_direct`), it goes to the driver
        itself, under the deadline the engine's statements have: SQLAlchemy's execution and
        result set-up cost an idle worker's claim about 0.2 ms of its pickup
        (``bench/idle_round_trip.py``). Engine events do not see it then. After a driver
        error it is sent again the usual way, on the same connection, where the engine's
        error hooks (a pooler's prepared statements) and SQLAlchemy's exceptions apply as
        for any statement: a claim is safe to repeat (what a lost one took waits for its
        lease). Anywhere else it goes through ``exec_driver_sql``, with the engine's events.
        """
        try:
            return self._rows(statement, params, as_text)
        except DBAPIError as exc:
            if not (again and exc.connection_invalidated):
                raise
        return self._rows(statement, params, as_text)

    def _rows(self, statement: sa.Executable, params: dict[str, Any], as_text: bool) -> list[Any]:
        if self._conn is None:
            self._conn = self._engine.connect()
        conn = self._conn
        try:
            text = text_of(conn, statement) if as_text else None
            if text is None:
                return list(conn.execute(statement, params).all())
            values = {**text.constants, **params}
            by_position = tuple(values[name] for name in text.names)
            limits = _direct(conn)
            if limits is not None:
                with contextlib.suppress(psycopg.Error):
                    return driver_rows(conn, text.text, by_position, limits)
                # Again the usual way, on the same connection: it meets the same error (a
                # pooler's prepared statements, a connection lost or cut) where the engine's
                # hooks and SQLAlchemy's exceptions apply, or it claims after all.
            return list(conn.exec_driver_sql(text.text, by_position).all())
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # it may be broken already
                conn.close()


def _direct(conn: Connection) -> tuple[float, StopClock | None] | None:
    """The statement deadline and stop clock of ``conn`` if :meth:`HeldConnection.rows` may
    send its text to the driver itself: a worker's own statements' connection
    (``guard_statements`` gave it a deadline), in autocommit, behind no transaction pooler
    (whose settings come with each transaction through the engine's events). None
    otherwise."""
    options = conn.get_execution_options()
    deadline = options.get(DEADLINE_OPTION)
    if deadline is None or not getattr(conn.connection.driver_connection, "autocommit", False):
        return None
    if as_pooler(options.get(POOLER_OPTION)) != "session":
        return None
    return float(deadline), options.get(CLOCK_OPTION)


def describe(url: URL) -> str:
    """The URL without its password, for messages."""
    return url.render_as_string(hide_password=True)


def ping(engine: Engine) -> None:
    """Connect once; DatabaseUnavailableError with a one-line reason if that fails.

    Failing means the driver's error, or one of SQLAlchemy's for a lost connection that
    :func:`sa_jobqueue._binds.transient` knows (the pool out of working connections at
    checkout, a connection lost during its setup); any other error is raised as it is.
    """
    try:
        with engine.connect() as conn:
            conn.execute(session_sql.ping())
    except SQLAlchemyError as exc:
        if not (isinstance(exc, DBAPIError) or transient(exc)):
            raise
        raise DatabaseUnavailableError(
            f"cannot connect to {describe(engine.url)}: {one_line(exc)}"
        ) from exc


def recorded(conn: Connection, table: str) -> list[str]:
    """Our revisions (``sajq_*``) recorded in Alembic version table ``table``, in order; none if
    the table does not exist."""
    if conn.execute(schema_sql.table_exists(), {"table": table}).scalar() is None:
        return []
    return list(conn.execute(schema_sql.recorded_revisions(table)).scalars())


def check_schema(bind: Engine | Connection) -> None:
    """Raise SchemaMissingError or SchemaOutdatedError unless the schema is at our head.

    Alembic's version table is consulted when it has a row of our branch; a schema created some
    other way (``metadata.create_all``) is checked by its columns instead. Given a Connection,
    it reads in that connection's transaction (and leaves it usable).
    """
    with bind.connect() if isinstance(bind, Engine) else contextlib.nullcontext(bind) as conn:
        table = jobs_table.name
        if conn.execute(schema_sql.table_exists(), {"table": table}).scalar() is None:
            raise SchemaMissingError(f"table {table} does not exist: {MIGRATE_HINT}")
        ours = [rev for version_table in VERSION_TABLES for rev in recorded(conn, version_table)]
        if ours and SCHEMA_REVISION not in ours:
            raise SchemaOutdatedError(
                f"the database's {BRANCH_LABEL} schema is at revision {ours[0]}, this version"
                f" needs {SCHEMA_REVISION}: {MIGRATE_HINT}"
                if ours[0] < SCHEMA_REVISION
                else f"the database's {BRANCH_LABEL} schema (revision {ours[0]}) is newer than"
                f" this version of sa_jobqueue knows ({SCHEMA_REVISION}): upgrade the package"
            )
        present = {c["name"] for c in inspect(conn).get_columns(table)}
        missing = sorted(set(jobs_table.c.keys()) - present)
        if missing:
            raise SchemaOutdatedError(
                f"table {table} lacks columns {', '.join(missing)}: {MIGRATE_HINT}"
            )
