"""Server settings applied below SQLAlchemy, in connection events, and the transaction pooler.

:func:`sa_jobqueue.database.create_engine` uses these: behind a direct connection or a session
pooler, :func:`set_on_connect` sets the engine's settings once on each new connection; behind a
transaction pooler, which refuses startup options and hands out a server connection per
transaction, :func:`parse_options` turns the URL's ``-c`` options into settings and
:func:`set_local_in_every_transaction` applies them (with the engine's) at the start of every
transaction. Internal; may change without notice.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any, Final

from psycopg import sql
from psycopg.pq import TransactionStatus
from sqlalchemy import Connection, Engine, event
from sqlalchemy.engine import ExceptionContext

from ._deadlines import DEADLINE_OPTION, DEADLINES, failed_connection_info
from .errors import DatabaseUnavailableError


def parse_options(text: str) -> dict[str, str]:
    """The ``-c name=value`` (or ``--name=value``) settings of a libpq ``options`` text.

    A transaction pooler cannot carry startup options, so their settings are applied in each
    transaction instead; any other server switch has no such form, and is refused.
    """
    words: list[str] = []
    word, escaped = "", False
    for char in text:
        if escaped:
            word, escaped = word + char, False
        elif char == "\\":
            escaped = True
        elif char.isspace():
            if word:
                words.append(word)
            word = ""
        else:
            word += char
    if word:
        words.append(word)
    settings: dict[str, str] = {}
    pending = False
    for item in words:
        if pending:
            assignment, pending = item, False
        elif item == "-c":
            pending = True
            continue
        elif item.startswith(("-c", "--")):
            assignment = item[2:]
        else:
            assignment = ""
        name, sep, value = assignment.partition("=")
        if not sep or not name:
            raise DatabaseUnavailableError(
                f"the connection option {item!r} cannot be used through a transaction pooler:"
                " only settings (-c name=value) can, applied in every transaction"
            )
        settings[name.replace("-", "_")] = value
    if pending:
        raise DatabaseUnavailableError("the connection options end with -c and no setting")
    return settings


def _set_config(settings: Mapping[str, str], *, local: bool) -> sql.Composed:
    """``SELECT set_config(name, value, local), ...`` for ``settings``, values as literals."""
    return sql.SQL("SELECT {}").format(
        sql.SQL(", ").join(
            sql.SQL("set_config({}, {}, {})").format(
                sql.Literal(name), sql.Literal(value), sql.Literal(local)
            )
            for name, value in settings.items()
        )
    )


def set_on_connect(engine: Engine, settings: Mapping[str, str]) -> None:
    """Apply ``settings`` once on every new connection, for as long as it lives.

    A statement rather than the ``options`` startup parameter, which PgBouncer refuses even
    in session mode.
    """
    apply = _set_config(settings, local=False)

    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection: Any, record: Any) -> None:
        autocommit = dbapi_connection.autocommit
        dbapi_connection.autocommit = True  # nothing to commit, nothing to roll back
        try:
            dbapi_connection.execute(apply)
        finally:
            dbapi_connection.autocommit = autocommit


#: Execution option of a connection whose statements must run outside any transaction block
#: (``CREATE INDEX CONCURRENTLY`` in a migration's autocommit block): behind a transaction
#: pooler, :func:`set_local_in_every_transaction` sends them as they are, without the
#: transaction and the settings it would wrap them in. They get none of the settings then
#: (no ``search_path`` either): such a statement names its objects with their schema.
OUTSIDE_TRANSACTION: Final = "sa_jobqueue_outside_transaction"


def set_local_in_every_transaction(engine: Engine, settings: Mapping[str, str]) -> None:
    """Apply ``settings`` with SET LOCAL semantics at the start of every transaction.

    A connection in autocommit mode has no transaction to put them in, so each statement it
    runs gets one of its own: ``BEGIN`` and the settings in one round trip before it, and
    ``COMMIT`` (or ``ROLLBACK``) after, three round trips where there was one. The worker
    runs few statements per job (claims and completions are batched), so this costs little;
    it is the price of timeouts that hold behind a transaction pooler. A connection with the
    execution option :data:`OUTSIDE_TRANSACTION` sends its statements unwrapped.
    """
    apply = _set_config(settings, local=True)
    begin_and_apply = sql.SQL("BEGIN; {}").format(apply)
    key = "sa_jobqueue_own_transaction"

    @event.listens_for(engine, "before_cursor_execute")
    def before(conn: Connection, cursor: Any, *_: Any) -> None:
        raw = cursor.connection
        if raw.info.transaction_status != TransactionStatus.IDLE:
            return  # inside a transaction that has its settings already
        if conn.get_execution_options().get(OUTSIDE_TRANSACTION):
            return  # a statement that no transaction block may hold
        with _guarded(conn, raw):
            if raw.autocommit:
                raw.execute(begin_and_apply)  # no parameters: one simple query, two statements
                conn.info[key] = True
            else:
                raw.execute(apply)  # psycopg sends BEGIN first

    @event.listens_for(engine, "after_cursor_execute")
    def after(conn: Connection, cursor: Any, *_: Any) -> None:
        if conn.info.pop(key, False):
            with _guarded(conn, cursor.connection):
                cursor.connection.execute(b"COMMIT")

    @event.listens_for(engine, "handle_error")
    def failed(context: ExceptionContext) -> None:
        conn = context.connection
        info = failed_connection_info(context)
        if conn is not None and info is not None and info.pop(key, False):
            with contextlib.suppress(Exception):  # the connection may be gone
                conn.connection.dbapi_connection.execute(b"ROLLBACK")  # type: ignore[union-attr]


def _guarded(conn: Connection, raw: Any) -> contextlib.AbstractContextManager[None]:
    """The worker's deadline for our own round trips on a connection that has one."""
    seconds = conn.get_execution_options().get(DEADLINE_OPTION)
    if seconds is None:
        return contextlib.nullcontext()
    return DEADLINES.guard(raw, seconds)


#: What to do once :func:`prepared_statement_clash` has seen the connection is a transaction
#: pooler's: the message of the error the worker stops with.
TRANSACTION_POOLER_HINT = (
    "the server connection changed between statements (psycopg's prepared statements were"
    " missing or already there): this looks like a pooler in transaction mode (PgBouncer's"
    " pool_mode = transaction); pass --pooler transaction (or set SA_JOBQUEUE_POOLER="
    'transaction; in Python, create_engine(url, pooler="transaction"))'
)


def prepared_statement_clash(exc: BaseException) -> bool:
    """Whether ``exc`` (a driver error, or SQLAlchemy's wrapping one) says a prepared statement
    psycopg made was missing, already there, or another one: what a connection whose
    statements land on different server connections sees.

    psycopg prepares a statement on a connection once it has run it a few times; behind a
    transaction pooler the next transaction may run on another server connection, where that
    name is unknown ("does not exist", SQLSTATE 26000), or names another statement ("already
    exists", 42P05; "bind message supplies N parameters", 08P01).
    """
    orig = getattr(exc, "orig", None) or exc
    sqlstate = getattr(orig, "sqlstate", None)
    return sqlstate in ("26000", "42P05", "08P01") and "prepared statement" in str(orig)


def on_prepared_statement_clash(engine: Engine, callback: Callable[[], None]) -> None:
    """Call ``callback`` whenever a statement of ``engine`` fails on a prepared statement clash
    (see :func:`prepared_statement_clash`); the error itself propagates as usual."""

    @event.listens_for(engine, "handle_error")
    def clash(context: ExceptionContext) -> None:
        if prepared_statement_clash(context.original_exception):
            callback()
