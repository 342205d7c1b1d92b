"""What a handler's database work runs in: its Session, and the checks on its connection.

The handler's Session (whose ``commit()`` only flushes), the savepoint Session of a job that
shares its thread's transaction and the engine view its group's connection comes from,
payload decoding, and the two questions the worker asks a handler's connection: how long may
the completion take, and is the transaction in error.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from typing import TYPE_CHECKING, Any

from psycopg.pq import TransactionStatus
from sqlalchemy import Connection, Engine, event
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import Session, SessionTransaction

from .._deadlines import DEADLINES, socket_of
from .._driver import command
from .._sql import session as session_sql
from ..errors import PayloadError

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession


class HandlerSession(Session):
    """The Session a handler gets: ``commit()`` only flushes.

    The worker commits the session's transaction (or releases its savepoint, when the job
    shares a transaction with others) together with the job's fenced completion; a handler
    committing on its own would let its writes through even when its attempt has lost its
    lease. ``rollback()`` works as usual.
    """

    def commit(self) -> None:
        """Flush, and leave committing to the worker."""
        self.flush()

    def commit_for_real(self) -> None:
        Session.commit(self)


#: ``Session.info`` key: the ``time.monotonic()`` by which the handler's attempt must be done
#: (its task's timeout), if it has one.
UNTIL = "sa_jobqueue_until"
_TOKEN = "sa_jobqueue_deadline_token"
#: How long after its task's timeout a handler's connection is cut (seconds). The heartbeat
#: looks for attempts past their timeout every 0.1 s and records the timeout first; cutting
#: then wakes a handler blocked in a statement that will never answer (a silent network, a
#: stuck lock), so its thread is free for the next job instead of lost for good.
CUT_AFTER_TIMEOUT = 1.0


def handler_session(bind: Engine, until: float | None) -> HandlerSession:
    """A handler's own Session on ``bind``; its connection is cut once ``until`` has passed."""
    return HandlerSession(bind=bind, info={} if until is None else {UNTIL: until})


_DRIVER = "sa_jobqueue_driver"


@event.listens_for(HandlerSession, "after_begin")
def _arm(session: Session, transaction: SessionTransaction, connection: Connection) -> None:
    """Watch a handler's connection from its first statement to the end of its transaction.

    Cut once its task's timeout has passed, if it has one; and cut by the heartbeat, whatever
    the task, if the handler waits for an answer the server is not working on (see
    :func:`waiting_on`). The connection is the handler's alone for as long as the session's
    transaction lasts (in a group, the thread's, which the group's jobs share in turn), and
    it is cut under the same lock that :func:`_disarm` takes: never once given back.
    """
    if _TOKEN in session.info:
        return
    driver = connection.connection.dbapi_connection
    fd = socket_of(driver)
    if fd is None:
        return
    until = session.info.get(UNTIL)
    seconds = math.inf if until is None else max(until - time.monotonic(), 0.0)
    session.info[_TOKEN] = DEADLINES.arm(fd, seconds + CUT_AFTER_TIMEOUT)
    session.info[_DRIVER] = driver


@event.listens_for(HandlerSession, "after_transaction_end")
def _disarm(session: Session, transaction: SessionTransaction) -> None:
    if transaction.parent is None:
        session.info.pop(_DRIVER, None)
        token = session.info.pop(_TOKEN, None)
        if token is not None:
            DEADLINES.disarm(token)


def waiting_on(session: Session | None) -> tuple[int, int] | None:
    """``(server process id, deadline token)`` of a handler's connection while the handler
    waits for the answer to a statement; None otherwise (no session, no statement running).

    Read from the heartbeat's thread: only reads, of a dict and of libpq's state.
    """
    if session is None:
        return None
    info = session.info
    token, driver = info.get(_TOKEN), info.get(_DRIVER)
    if token is None or driver is None:
        return None
    try:
        if driver.info.transaction_status != TransactionStatus.ACTIVE:
            return None
        return int(driver.info.backend_pid), int(token)
    except Exception:  # closed meanwhile
        return None


class GroupSession(HandlerSession):
    """The Session of a job that shares its thread's transaction with other jobs.

    Its transaction is a savepoint of the shared one (``join_transaction_mode=
    "create_savepoint"``): ``rollback()``, a failed flush, or closing it without
    :meth:`commit_for_real` rolls back to the savepoint, this job's writes only; the shared
    transaction is committed by the worker, never by the session.
    """

    def __init__(self, bind: Connection, until: float | None = None) -> None:
        super().__init__(
            bind=bind,
            join_transaction_mode="create_savepoint",
            info={} if until is None else {UNTIL: until},
        )


class _KeptSavepoints:
    """Dialect methods for a group's connection: savepoints sent straight to the driver, and
    left in place when SQLAlchemy releases them.

    Why not release: a job's savepoint exists so that its own failure can be rolled back
    alone. Releasing it on success would cost a round trip per job and change nothing that
    matters: the next job's savepoint, nested inside, still rolls back only what that job
    wrote (``ROLLBACK TO`` a name undoes from that savepoint on), and the group's ``COMMIT``
    or ``ROLLBACK`` ends them all. A savepoint kept or released takes the same subtransaction
    id, so the group's cap on jobs (``GROUP_MAX_JOBS``) holds as before. SQLAlchemy still
    thinks each one released, so its state stays consistent with what handlers see.

    Why the driver: SQLAlchemy sends its savepoint statements through its compiler, and as
    it names each savepoint anew, each is compiled afresh and fills the compiled cache.
    """

    def do_savepoint(self, connection: Connection, name: str) -> None:
        driver = connection.connection.driver_connection
        assert driver is not None  # the connection is live: its transaction has begun
        statement = session_sql.savepoint(name)
        if driver.info.transaction_status == TransactionStatus.IDLE:
            # The transaction's first statement: through SQLAlchemy's execution, whose events
            # start the transaction as the engine needs it (SET LOCAL behind a pooler).
            connection.exec_driver_sql(statement.as_string(driver))
            return
        command(driver, statement)

    def do_release_savepoint(self, connection: Connection, name: str) -> None:
        """Keep it: the transaction's end releases it (see the class)."""

    def do_rollback_to_savepoint(self, connection: Connection, name: str) -> None:
        driver = connection.connection.driver_connection
        assert driver is not None  # a savepoint was made on this live connection
        command(driver, session_sql.rollback_to_savepoint(name))


#: The dialect class with :class:`_KeptSavepoints` mixed in, per dialect class.
_KEEPING: dict[type[Dialect], type[Dialect]] = {}


def _keeping_savepoints(dialect_class: type[Dialect]) -> type[Dialect]:
    kept = _KEEPING.get(dialect_class)
    if kept is None:
        kept = _KEEPING[dialect_class] = type(
            f"KeptSavepoints{dialect_class.__name__}",
            (_KeptSavepoints, dialect_class),
            # A subclass must say again that SQLAlchemy may cache its compiled statements.
            {"supports_statement_cache": True},
        )
    return kept


def group_engine(engine: Engine) -> Engine:
    """A view of ``engine`` for the group connections: same pool, events and options.

    Only its dialect differs, in how it sends savepoints and that it keeps them
    (:class:`_KeptSavepoints`); handlers' sessions of their own and the worker's statements
    use ``engine`` itself, with SQLAlchemy's usual savepoints.
    """
    view = engine.execution_options()
    dialect = engine.dialect
    kept = _keeping_savepoints(type(dialect))
    copy = kept.__new__(kept)
    copy.__dict__.update(dialect.__dict__)
    view.dialect = copy
    return view


def pending_writes(session: AsyncSession) -> bool:
    """Whether flushing ``session`` would write anything: ORM objects added, changed or
    deleted (what ``Session.flush`` looks at before it does nothing)."""
    return bool(session.new or session.dirty or session.deleted)


def decode(payload: str) -> Any:
    """The job's payload from the JSON text the claim returned."""
    try:
        return json.loads(payload)
    except (ValueError, RecursionError) as exc:
        raise PayloadError(f"the payload could not be decoded: {type(exc).__name__}") from exc


def deadline(conn: Connection) -> contextlib.AbstractContextManager[None]:
    """The worker's client-side deadline for its completion on a handler's connection."""
    return DEADLINES.guard(conn.connection.dbapi_connection)


def broken(conn: Connection) -> bool:
    """Whether the connection was lost: invalidated, closed, or its socket gone.

    Never raises, whatever state the connection is in: a job thread asks it to decide whether
    to throw its connection away. Savepoints go straight to the driver (see
    :class:`_KeptSavepoints`), so a connection lost under one is known to psycopg before
    SQLAlchemy hears of it: both are asked.
    """
    if conn.closed or conn.invalidated:
        return True
    try:
        driver = conn.connection.driver_connection
    except Exception:  # SQLAlchemy refuses to reach it (an invalid transaction pending)
        return True
    return driver is None or bool(driver.closed) or bool(getattr(driver, "broken", False))


def aborted(conn: Connection) -> bool:
    """Whether the connection's transaction is in error: only a rollback is accepted now.

    False for a connection that was lost (see :func:`broken`): there is nothing to roll back.
    """
    if broken(conn):
        return False
    driver = conn.connection.driver_connection
    return bool(driver is not None and driver.info.transaction_status == TransactionStatus.INERROR)
