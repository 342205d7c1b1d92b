"""Statements about the session itself rather than the queue's tables."""

from __future__ import annotations

from functools import cache

from psycopg import sql
from sqlalchemy import Integer, Select, Text, bindparam, func, literal, literal_column, select


@cache
def ping() -> Select[int]:
    """``SELECT 1``: proves that a connection works, and nothing else."""
    return select(literal_column("1"))


@cache
def terminate_backend() -> Select[bool]:
    """End the server session ``:pid`` (rolling its transaction back, freeing its locks)."""
    return select(func.pg_terminate_backend(bindparam("pid", type_=Integer)))


@cache
def local_statement_timeout() -> Select[str]:
    """``SET LOCAL statement_timeout`` to ``:timeout_ms``: for the rest of this transaction."""
    # set_config() rather than SET LOCAL, which takes no bind parameters.
    return select(
        func.set_config(literal("statement_timeout"), bindparam("timeout_ms", type_=Text), True)
    )


@cache
def transaction_id_if_written() -> Select[int | None]:
    """The current transaction's id if it has written (or locked a row) yet, else NULL."""
    # A transaction gets an id only when it first writes: asking for it with
    # txid_current() would assign one, and so make the transaction look written.
    return select(func.txid_current_if_assigned())


@cache
def current_schema() -> Select[str | None]:
    """The schema that unqualified table names resolve to (first on the search_path)."""
    return select(func.current_schema())


def savepoint(name: str) -> sql.Composed:
    """``SAVEPOINT name``, for the driver: a group's job savepoints bypass SQLAlchemy's compiler.

    SQLAlchemy names each savepoint anew (``sa_savepoint_7``), so its own ``SAVEPOINT``
    statement is compiled afresh every time and crowds the compiled-statement cache.
    """
    return sql.SQL("SAVEPOINT {}").format(sql.Identifier(name))


def rollback_to_savepoint(name: str) -> sql.Composed:
    """``ROLLBACK TO SAVEPOINT name``, for the driver (see :func:`savepoint`)."""
    return sql.SQL("ROLLBACK TO SAVEPOINT {}").format(sql.Identifier(name))
