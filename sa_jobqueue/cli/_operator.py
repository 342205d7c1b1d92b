"""What the operators' commands share: ``stats``, ``jobs ...``, ``workflows ...``, ``queues ...``
and ``check``.

Each command opens a short-lived engine of its own with time limits on its statements
(:data:`OPERATOR_SETTINGS`), so a query stuck behind a lock fails instead of hanging a
terminal or a monitoring probe. A database error is one line on stderr and exit status 1;
``check`` reports an unreachable database as critical (2) instead, as a probe should (it
opens its engine itself, in :mod:`._check`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import datetime
from typing import Final

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from .._sql.clock import database_now
from ..database import check_schema, create_engine, ping
from ._exit import EXIT_ERROR

#: Limits for the operator commands' sessions: a query stuck behind a lock or on an overloaded
#: server fails instead of hanging a terminal or a monitoring probe.
OPERATOR_SETTINGS: Final = {"statement_timeout": "60s", "lock_timeout": "10s"}

#: A command's work once its engine is open and the schema checked; its exit status.
Command = Callable[[Engine, argparse.Namespace], int]


def operate(args: argparse.Namespace, command: Command) -> int:
    """Run ``command`` on an engine of its own, once the database answers and holds our
    schema; its exit status, or 1 with one line on stderr on a database error."""
    engine = operator_engine(args)
    try:
        ping(engine)
        check_schema(engine)
        return command(engine, args)
    except DBAPIError as exc:
        print(f"sa-jobqueue: {reason(exc)}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        engine.dispose()


def operator_engine(args: argparse.Namespace) -> Engine:
    """An engine with :data:`OPERATOR_SETTINGS`, no pool, named after the command."""
    return create_engine(
        args.database_url,
        pooler=args.pooler,
        settings=OPERATOR_SETTINGS,
        poolclass=NullPool,
        connect_args={"application_name": f"sa-jobqueue {args.command}"},
    )


def reason(exc: DBAPIError) -> str:
    """A driver error's first line: what went wrong, without SQLAlchemy's statement dump."""
    text = str(exc.orig) if exc.orig is not None else str(exc)
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


def database_time(conn: Connection) -> datetime:
    """The database's ``now()``, which the commands show times relative to."""
    moment: datetime = conn.execute(database_now()).scalar_one()
    return moment
