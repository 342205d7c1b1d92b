"""Engines for the worker and the CLI, and the schema check workers run before they start."""

from __future__ import annotations

import contextlib
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection, Engine, inspect
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError

from .errors import DatabaseUnavailableError, SchemaMissingError, SchemaOutdatedError
from .models import BRANCH_LABEL, SCHEMA_REVISION, jobs_table

#: Where a revision of ours may be recorded: our own table (``sa-jobqueue migrate``), or the
#: application's when our revisions joined its Alembic history.
VERSION_TABLES = ("sa_jobqueue_alembic_version", "alembic_version")
MIGRATE_HINT = "run `sa-jobqueue migrate` (or `alembic upgrade heads` in your Alembic setup)"


def normalise_url(url: str | URL) -> URL:
    """Parse a database URL and make it use psycopg 3, the driver sa_jobqueue runs on.

    Plain ``postgresql://`` (SQLAlchemy would pick psycopg2) and the URLs of the other common
    PostgreSQL drivers are switched to ``postgresql+psycopg://``; anything else is refused.
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
    if driver not in ("", "psycopg", "psycopg2", "asyncpg", "psycopg_async"):
        raise DatabaseUnavailableError(
            f"unsupported driver {parsed.drivername!r}: sa_jobqueue uses psycopg 3"
            " (postgresql+psycopg://...)"
        )
    return parsed.set(drivername="postgresql+psycopg")


def _redact(url: str | URL) -> str:
    if isinstance(url, URL):
        return describe(url)
    # A string that would not parse may still hold a password: drop what sits before the @.
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}...@{rest.rsplit('@', 1)[1]}" if "@" in rest else url


#: Connection settings for every connection sa_jobqueue opens.
CONNECT_ARGS: dict[str, Any] = {
    "connect_timeout": 10,
    "application_name": "sa_jobqueue",
    # TCP keepalives find a half-open connection (a server or network that vanished without a
    # FIN) after about 30 + 3 * 10 = 60 s instead of the kernel's default of two hours.
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
}
#: Server-side limits for the worker's own statements (claim, lease renewal, outcomes). Each
#: is a single indexed statement that takes milliseconds; anything near these limits is a
#: stuck lock or server, and failing lets the worker retry instead of hanging.
CONTROL_OPTIONS = (
    "-c statement_timeout=30s -c lock_timeout=10s -c idle_in_transaction_session_timeout=30s"
)


def create_engine(url: str | URL, **kwargs: Any) -> Engine:
    """A SQLAlchemy engine on psycopg 3 with timeouts on connecting and TCP keepalives.

    No ``pool_pre_ping`` unless you ask for it: it costs a round trip at every checkout (a
    third of a single enqueue's time here, and one per job for a worker's handlers). Without
    it, a connection broken by a server restart fails once, and SQLAlchemy then replaces every
    connection the pool had made before; a job that fails that way is retried.
    """
    connect_args = {**CONNECT_ARGS, **kwargs.pop("connect_args", {})}
    return sa.create_engine(normalise_url(url), connect_args=connect_args, **kwargs)


def create_control_engine(url: str | URL, concurrency: int) -> Engine:
    """The engine for a worker's own statements: autocommit, with statement timeouts.

    Handlers get an engine without these limits: how long their queries may run is the
    application's business.
    """
    url = normalise_url(url)
    # Keep the URL's own server options (a search_path, say): ours are added to them, since
    # connect_args would otherwise replace them and the claim would look at another schema.
    given = url.query.get("options")
    own = " ".join(given) if isinstance(given, tuple) else given
    return create_engine(
        url.difference_update_query(["options"]),
        connect_args={"options": f"{own} {CONTROL_OPTIONS}" if own else CONTROL_OPTIONS},
        isolation_level="AUTOCOMMIT",
        # The heartbeat's statements are rare: a ping first costs little, and a renewal that
        # fails on a stale connection would leave leases unrenewed for a while.
        pool_pre_ping=True,
        # The claim loop, the heartbeat and the completer, plus one per job recording a
        # failure at once.
        pool_size=3,
        max_overflow=concurrency,
    )


class HeldConnection:
    """One autocommit connection a worker thread keeps between its statements.

    The claim loop and the completer run a statement every few milliseconds under load; taking
    a pooled connection for each would add a checkout and, with pre-ping, a round trip. After
    any error the connection is dropped, and the next statement connects afresh.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._conn: Connection | None = None

    def rows(self, statement: sa.Executable, params: dict[str, Any]) -> list[Any]:
        """Run one statement and fetch all its rows."""
        if self._conn is None:
            self._conn = self._engine.connect()
        try:
            return list(self._conn.execute(statement, params).all())
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # it may be broken already
                conn.close()


def describe(url: URL) -> str:
    """The URL without its password, for messages."""
    return url.render_as_string(hide_password=True)


def ping(engine: Engine) -> None:
    """Connect once; DatabaseUnavailableError with a one-line reason if that fails."""
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except DBAPIError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise DatabaseUnavailableError(
            f"cannot connect to {describe(engine.url)}: {reason}"
        ) from exc


def check_schema(bind: Engine | Connection) -> None:
    """Raise SchemaMissingError or SchemaOutdatedError unless the schema is at our head.

    Alembic's version table is consulted when it has a row of our branch; a schema created some
    other way (``metadata.create_all``) is checked by its columns instead. Given a Connection,
    it reads in that connection's transaction (and leaves it usable).
    """
    with bind.connect() if isinstance(bind, Engine) else contextlib.nullcontext(bind) as conn:
        table = jobs_table.name
        if conn.execute(sa.select(sa.func.to_regclass(table))).scalar() is None:
            raise SchemaMissingError(f"table {table} does not exist: {MIGRATE_HINT}")
        ours: list[str] = []
        for version_table in VERSION_TABLES:
            if conn.execute(sa.select(sa.func.to_regclass(version_table))).scalar() is None:
                continue
            versions = sa.table(version_table, sa.column("version_num", sa.Text))
            ours += conn.execute(
                sa.select(versions.c.version_num).where(versions.c.version_num.like("sajq_%"))
            ).scalars()
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
