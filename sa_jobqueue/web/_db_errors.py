"""A database error as the dashboard says it: one sentence, and what to do about those we know."""

from __future__ import annotations

from typing import Final

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from ..database import check_schema
from ..errors import SchemaError

#: PostgreSQL's SQLSTATEs the pages explain rather than report.
UNDEFINED_TABLE: Final = "42P01"
UNDEFINED_COLUMN: Final = "42703"
INSUFFICIENT_PRIVILEGE: Final = "42501"
QUERY_CANCELED: Final = "57014"


def explain(exc: DBAPIError, engine: Engine, timeout_ms: int) -> str:
    """``exc`` in one sentence; for a missing table or column, what the schema check says."""
    code = getattr(exc.orig, "sqlstate", None)
    first = (str(exc.orig) if exc.orig is not None else str(exc)).strip()
    reason = first.splitlines()[0] if first else type(exc).__name__
    if code in (UNDEFINED_TABLE, UNDEFINED_COLUMN):
        try:
            check_schema(engine)
        except SchemaError as schema:
            return str(schema)
        except DBAPIError:
            pass
    if code == INSUFFICIENT_PRIVILEGE:
        return (
            f"the database refused: {reason} (this role may only read; actions need"
            " UPDATE and DELETE on sa_jobqueue_jobs, pausing INSERT and UPDATE on"
            " sa_jobqueue_queues, pages need SELECT on the tables)"
        )
    if code == QUERY_CANCELED:
        return f"the database gave up: {reason} (over {timeout_ms // 1000}s)"
    return f"the database refused: {reason}"
