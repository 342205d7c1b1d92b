"""The caller's transaction: the Connection behind whatever Session or Connection we were given.

Enqueue and the job admin calls run in the caller's transaction. :data:`SessionLike` is what
their sync forms accept and :func:`connection_of` finds the Connection behind it;
:func:`run_async` runs the same sync code for an ``AsyncSession`` or ``AsyncConnection``, inside
SQLAlchemy's greenlet bridge, so each async method is a thin shell around its sync logic: same
statements, same transaction, same per-transaction bookkeeping (keyed by the sync Transaction
objects the async ones wrap).

Two calls go below SQLAlchemy, to the psycopg connection under the caller's: :func:`first_row`
sends enqueue's one INSERT straight to the driver when nothing could tell the difference
(SQLAlchemy's execute costs two to three times the driver's own time for it), and
:func:`copy_rows` runs the COPY of a large ``enqueue_many``, which SQLAlchemy has no statement
for. Both stay in the caller's transaction, and a database error comes out as SQLAlchemy's
execute would raise it.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Final, NamedTuple, TypeAlias, TypeVar

import psycopg
from psycopg import sql
from sqlalchemy import Connection, Insert
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import (
    DBAPIError,
    DisconnectionError,
    InterfaceError,
    InvalidRequestError,
    MissingGreenlet,
    OperationalError,
    SQLAlchemyError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session, scoped_session
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ClauseElement

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_scoped_session

    AsyncSessionLike: TypeAlias = (
        AsyncSession | async_scoped_session[AsyncSession] | AsyncConnection
    )

T = TypeVar("T")

#: What the sync enqueue and admin calls write or read through: the caller's transaction.
SessionLike: TypeAlias = Session | scoped_session[Session] | Connection


def connection_of(session: SessionLike) -> Connection:
    """The Connection of ``session``'s transaction; TypeError for anything else."""
    # Session.connection() joins the session's transaction (beginning it if needed) without
    # flushing pending objects: we add the job row and touch nothing else of the caller's.
    if isinstance(session, _SESSIONS):
        try:
            bind: Any = session.get_bind()
        except SQLAlchemyError:
            return _connection(session)  # no single bind to look at: connection() says why
        # An asyncio driver works only inside SQLAlchemy's greenlet bridge (the Session that
        # AsyncSession.run_sync hands over); outside it, refuse before connecting, which
        # would fail deep in SQLAlchemy and leave a never-awaited coroutine behind.
        if type(bind).__module__.startswith("sqlalchemy.ext.asyncio") or (
            getattr(getattr(bind, "dialect", None), "is_async", False) and _outside_bridge()
        ):
            raise TypeError(_ASYNC_BIND)
        # The bind just found, given: connection() would ask get_bind() for it again.
        return _connection(session, {"bind": bind})
    if isinstance(session, Connection):
        return session
    hint = ""
    if type(session).__module__.startswith("sqlalchemy.ext.asyncio"):
        hint = " (for an AsyncSession or AsyncConnection, await aenqueue, acancel, ...)"
    raise TypeError(
        "enqueue needs a SQLAlchemy Session, scoped_session or Connection,"
        f" not {type(session).__name__}{hint}"
    )


#: What :func:`connection_of` asks for a Session's connection (a tuple: isinstance checks one
#: faster than a union).
_SESSIONS: Final = (Session, scoped_session)


def _connection(
    session: Session | scoped_session[Session], bind_arguments: dict[str, Any] | None = None
) -> Connection:
    """``session.connection()``; TypeError if the Session is async and this is not its bridge."""
    try:
        return session.connection(bind_arguments)
    except MissingGreenlet as exc:  # _outside_bridge could not tell
        raise TypeError(_ASYNC_BIND) from exc


def _outside_bridge() -> bool:
    """True when surely not running inside SQLAlchemy's greenlet bridge; False if unsure."""
    # sqlalchemy.util is not public API: if in_greenlet moves, say "unsure" and let the
    # connection attempt tell instead.
    from sqlalchemy.util import concurrency

    in_greenlet = getattr(concurrency, "in_greenlet", None)
    return in_greenlet is not None and not in_greenlet()


_ASYNC_BIND: Final = (
    "this Session is bound to an async engine (an asyncio driver), which sync code cannot"
    " use: enqueue through an AsyncSession with await aenqueue (acancel, aget_job, ...)"
)


async def run_async(session: AsyncSessionLike, work: Callable[[Connection], T]) -> T:
    """Run ``work`` on the sync Connection behind an async session or connection, awaited.

    SQLAlchemy's ``run_sync`` runs it in a greenlet whose database calls are awaited on the
    caller's event loop: the sync code path, in the caller's transaction, without blocking.
    """
    # Imported here: sqlalchemy.ext.asyncio needs greenlet, which only async callers must have.
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_scoped_session

    if isinstance(session, AsyncConnection):
        return await session.run_sync(work)
    if isinstance(session, async_scoped_session):
        session = session()  # the current task's AsyncSession
    if isinstance(session, AsyncSession):
        # Session.connection() joins the session's transaction without flushing.
        return await session.run_sync(lambda sync: work(sync.connection()))
    raise TypeError(
        "the async methods need a SQLAlchemy AsyncSession, async_scoped_session or"
        f" AsyncConnection, not {type(session).__name__} (for a Session or Connection, call"
        " the method without the 'a' prefix)"
    )


#: What SQLAlchemy's pool raises when a connection failed its check at checkout (a
#: ``checkout`` hook raising DisconnectionError: the ping of
#: :func:`sa_jobqueue.database.ping_at_checkout`) and so did the fresh one that replaced it
#: ("Reconnection attempts exhausted on checkout"): the same text as, but another class than,
#: the ResourceClosedError of a Connection used after it was closed (a caller's mistake).
_CHECKOUT_EXHAUSTED = "This connection is closed"


def transient(exc: BaseException) -> bool:
    """Whether a failed statement may well succeed if tried again soon: the connection was
    lost or refused, a timeout or a pool exhausted; not an error in the statement itself."""
    if isinstance(exc, DBAPIError):
        # The driver's error: a lost connection, or an operational one (refused, "too many
        # clients", a server shutting down), not the statement's.
        return exc.connection_invalidated or isinstance(exc, (OperationalError, InterfaceError))
    if type(exc) is InvalidRequestError:
        # Exactly this class, with exactly this text: the pool gave up after every connection
        # it tried at checkout failed its ping (see _CHECKOUT_EXHAUSTED). Its subclasses, and
        # its other texts, are mistakes in the calling code.
        return str(exc) == _CHECKOUT_EXHAUSTED
    # PoolTimeout: no connection came free in time. DisconnectionError: a connection found
    # lost below SQLAlchemy's statements (at checkout, or during the setup of an engine's
    # first connection: sa_jobqueue.database.guard_dialect_setup).
    return isinstance(exc, (PoolTimeout, DisconnectionError))


# -- below SQLAlchemy -----------------------------------------------------------------------


class _DriverText(NamedTuple):
    """A statement as SQLAlchemy would send it to psycopg, with its parameters by position.

    ``text`` is SQLAlchemy's text with each ``%(name)s`` made a ``%s``, ``names`` the names in
    the text's order (psycopg reorders a dict by name into the same list on every call; a
    list given in that order skips the step), and ``constants`` the values the statement binds
    itself.
    """

    text: str
    names: tuple[str, ...]
    constants: dict[str, Any]


#: Per dialect (one per engine), each statement's driver text, or None where only SQLAlchemy's
#: execute can send it. Computed once: the text of a cached statement never changes.
_driver_texts: Final[weakref.WeakKeyDictionary[Dialect, dict[Insert, _DriverText | None]]] = (
    weakref.WeakKeyDictionary()
)

#: Where :func:`first_row` keeps its cursor: in the pooled connection's ``info``, which lives
#: and dies with the psycopg connection (a cursor costs as much to make as a short INSERT).
_CURSOR: Final = "sa_jobqueue.cursor"

#: A named placeholder of a pyformat text, or an escaped percent sign (kept as it is).
_PLACEHOLDER: Final = re.compile(r"%%|%\((\w+)\)s")


def first_row(conn: Connection, statement: Insert, params: dict[str, Any]) -> Sequence[Any] | None:
    """Run ``statement`` in ``conn``'s transaction; its first row, or None if it returned none.

    Sent straight to psycopg, with the text and values SQLAlchemy's execute would send (the
    values by position), when that changes nothing observable: the driver is psycopg, nothing
    listens to the engine's or the connection's events (statement logging, tracing
    instrumentation, the transaction pooler's settings, ``handle_error`` hooks), statements are
    not echoed, no ``schema_translate_map`` is set, and the transaction is active. Otherwise,
    and for a statement whose compiled form needs SQLAlchemy's processing of its values, it
    goes through ``conn.execute``. Either way an error is raised as SQLAlchemy raises it (a
    ``sqlalchemy.exc.DBAPIError`` subclass, the connection invalidated on a disconnect).
    """
    driver = _direct_text(conn, statement)
    if driver is None:
        return conn.execute(statement, params).first()
    values = {**driver.constants, **params} if driver.constants else params
    args = [values[name] for name in driver.names]
    proxied = conn.connection
    raw: Any = proxied.driver_connection
    try:
        cursor: Any = proxied.info.get(_CURSOR)
        if cursor is None or cursor.closed or cursor.connection is not raw:
            cursor = proxied.info[_CURSOR] = raw.cursor()
        if isinstance(raw, psycopg.AsyncConnection):
            # One switch to the event loop for both calls, as SQLAlchemy's own adapter does.
            return await_(_execute_async(cursor, driver.text, args))  # type: ignore[no-any-return]
        cursor.execute(driver.text, args)
        return cursor.fetchone()  # type: ignore[no-any-return]
    except BaseException as exc:
        # SQLAlchemy's own handling: the exception conn.execute would raise, the connection
        # invalidated if the error was a disconnect, handle_error hooks run. The cursor is
        # kept for the next call (psycopg's cursors outlive a failed statement).
        conn._handle_dbapi_exception(exc, driver.text, args, None, None)


async def _execute_async(
    cursor: psycopg.AsyncCursor[Any], text: str, args: list[Any]
) -> Sequence[Any] | None:
    await cursor.execute(text, args)
    return await cursor.fetchone()


def _direct_text(conn: Connection, statement: Insert) -> _DriverText | None:
    """``statement``'s driver text if it may skip SQLAlchemy's execute on ``conn``; else None."""
    dialect = conn.dialect
    if (
        dialect.driver != "psycopg"
        # SQLAlchemy's execute checks these flags to fire events, log and hook errors: when
        # one is set, it has work to do that only it can do.
        or conn._has_events
        or conn.engine._has_events
        or dialect._has_events
        or conn._echo
        or "schema_translate_map" in conn.get_execution_options()
    ):
        return None
    transaction = conn.get_nested_transaction() or conn.get_transaction()
    if transaction is None or not transaction.is_active:
        return None  # let SQLAlchemy begin it, or say why it cannot be used
    texts = _driver_texts.get(dialect)
    if texts is None:
        texts = _driver_texts.setdefault(dialect, {})
    try:
        return texts[statement]
    except KeyError:
        texts[statement] = text = _driver_text(statement, dialect)
        return text


def _driver_text(statement: ClauseElement, dialect: Dialect) -> _DriverText | None:
    """What SQLAlchemy's execute would send to psycopg for ``statement``, if only that."""
    compiled = statement.compile(dialect=dialect)
    if (
        not isinstance(compiled, SQLCompiler)
        or dialect.paramstyle != "pyformat"
        or compiled.positional
        or compiled.escaped_bind_names
        or compiled.literal_execute_params
        or compiled.post_compile_params
        or compiled.has_out_parameters
        # Values SQLAlchemy would convert before psycopg sees them (none of ours has one).
        or compiled._bind_processors
    ):
        return None
    constants: dict[str, Any] = {}
    for bind, name in compiled.bind_names.items():
        if bind.callable is not None:
            return None
        if not bind.required:
            constants[name] = bind.value
    names: list[str] = []

    def by_position(match: re.Match[str]) -> str:
        if match[1] is None:
            return "%%"
        names.append(match[1])
        return "%s"

    text = _PLACEHOLDER.sub(by_position, compiled.string)
    return _DriverText(text, tuple(names), constants)


def copy_possible(conn: Connection) -> bool:
    """Whether :func:`copy_rows` may run on ``conn``: psycopg, in a transaction, no schema map.

    Not on an autocommit connection: there each statement commits alone, and a COPY's rows
    would commit apart from the statement before it that draws their ids and sends their
    NOTIFY.
    """
    if conn.dialect.driver != "psycopg" or "schema_translate_map" in conn.get_execution_options():
        return False
    raw: Any = conn.connection.driver_connection
    return not raw.autocommit


def copy_rows(conn: Connection, statement: sql.Composed, rows: Iterable[Sequence[Any]]) -> None:
    """COPY ``rows`` in with ``statement`` (``COPY ... FROM STDIN``), in ``conn``'s transaction.

    psycopg writes each row in COPY's text format (a tab, a newline or a backslash in a value
    is escaped). Sent below SQLAlchemy, so its events do not see it; an error is raised as
    SQLAlchemy's execute raises it.
    """
    raw: Any = conn.connection.driver_connection
    try:
        if isinstance(raw, psycopg.AsyncConnection):
            await_(_copy_async(raw, statement, rows))
            return
        with raw.cursor() as cursor, cursor.copy(statement) as copy:
            for row in rows:
                copy.write_row(row)
    except BaseException as exc:
        conn._handle_dbapi_exception(exc, statement.as_string(raw), None, None, None)


async def _copy_async(
    raw: psycopg.AsyncConnection[Any], statement: sql.Composed, rows: Iterable[Sequence[Any]]
) -> None:
    async with raw.cursor() as cursor, cursor.copy(statement) as copy:
        for row in rows:
            await copy.write_row(row)


def await_(awaitable: Any) -> Any:
    """Await ``awaitable`` from the sync code ``run_async`` runs inside SQLAlchemy's greenlet."""
    global _await
    if _await is None:
        # Imported on first use, like the asyncio extension: only async callers have greenlet.
        # SQLAlchemy 2.1 calls it await_; 2.0 await_only (kept in 2.1, deprecated).
        from sqlalchemy import util

        _await = getattr(util, "await_", None) or util.await_only
    return _await(awaitable)


_await: Callable[[Any], Any] | None = None
