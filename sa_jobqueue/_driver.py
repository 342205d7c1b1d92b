"""Everything sa_jobqueue sends below SQLAlchemy, to psycopg (or libpq) itself, in one place.

Three callers go around SQLAlchemy's execute, each where its cost was measured to matter and
nothing could tell the difference:

- enqueue's one INSERT (:func:`first_row`) in the caller's transaction, when no event, echo
  or schema map would have seen it (SQLAlchemy's execute costs two to three times the
  driver's own time for it), and the COPY of a large ``enqueue_many`` (:func:`copy_rows`),
  which SQLAlchemy has no statement for;
- the worker's claims on its own autocommit connection (:func:`text_of`, :func:`driver_rows`,
  under the engine's statement deadline: ``HeldConnection.rows``);
- a group's savepoints, as libpq commands (:func:`command`).

A statement's text, as SQLAlchemy would send it, is compiled once per dialect and kept in one
cache (:func:`driver_text`). Errors come out as they would through SQLAlchemy's execute (the
first two), or as psycopg raises them (the savepoints).
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, NamedTuple

import psycopg
from psycopg import sql
from psycopg.pq import ExecStatus
from psycopg.rows import namedtuple_row
from sqlalchemy import Connection, Executable, Insert
from sqlalchemy.engine import Dialect
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ClauseElement

from ._deadlines import DEADLINES, StopClock


class DriverText(NamedTuple):
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
#: execute can send it: the one cache of them, for the enqueue's INSERT (:func:`first_row`) and
#: the worker's claims (:func:`rows_as_text`). Computed once: the text of a statement built
#: once (the builders cache theirs) never changes.
_TEXTS: Final[weakref.WeakKeyDictionary[Dialect, dict[ClauseElement, DriverText | None]]] = (
    weakref.WeakKeyDictionary()
)


def driver_text(dialect: Dialect, statement: ClauseElement) -> DriverText | None:
    """``statement``'s :class:`DriverText` for ``dialect`` (None: only SQLAlchemy's execute
    can send it), from the one cache."""
    texts = _TEXTS.get(dialect)
    if texts is None:
        texts = _TEXTS.setdefault(dialect, {})
    try:
        return texts[statement]
    except KeyError:
        texts[statement] = text = _driver_text(statement, dialect)
        return text


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


def _direct_text(conn: Connection, statement: Insert) -> DriverText | None:
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
    return driver_text(dialect, statement)


def _driver_text(statement: ClauseElement, dialect: Dialect) -> DriverText | None:
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
    return DriverText(text, tuple(names), constants)


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


def driver_rows(
    conn: Connection,
    text: str,
    by_position: tuple[Any, ...],
    limits: tuple[float, StopClock | None],
) -> list[Any]:
    """Run ``text`` on ``conn``'s psycopg connection under its deadline; its rows, as named
    tuples (what :class:`~sqlalchemy.engine.Row` offers the callers: ``_fields`` and
    attributes)."""
    driver: Any = conn.connection.driver_connection
    seconds, clock = limits
    with DEADLINES.guard(driver, seconds, clock), driver.cursor(row_factory=namedtuple_row) as cur:
        return list(cur.execute(text, by_position).fetchall())


def text_of(conn: Connection, statement: Executable) -> DriverText | None:
    """``statement``'s driver text on ``conn``, if it may be sent as text; else None."""
    if not isinstance(statement, ClauseElement):
        return None
    if "schema_translate_map" in conn.get_execution_options():
        return None
    return driver_text(conn.dialect, statement)


def command(driver: psycopg.Connection[Any], statement: sql.Composed) -> None:
    """Run a command that returns no rows and takes no parameters, through libpq itself.

    A savepoint needs none of what psycopg's ``execute`` does around it (a cursor, adapting
    parameters, counting queries to prepare, reading a result set): that costs about as much
    client CPU as the round trip's system calls (``bench/profile.py``). libpq releases the
    GIL while it waits, as psycopg does. An error is raised as psycopg raises it, from the
    server's SQLSTATE, or as an ``OperationalError`` once the connection is lost (which
    leaves the driver ``closed``, what :func:`broken` reads).
    """
    result = driver.pgconn.exec_(statement.as_bytes(driver))
    if result.status == ExecStatus.COMMAND_OK:
        return
    if driver.closed:
        message = (result.error_message or driver.pgconn.error_message).decode(errors="replace")
        raise psycopg.OperationalError(message.strip() or "the connection was lost")
    raise psycopg.errors.error_from_result(result, encoding=driver.info.encoding)
