"""The caller's transaction: the Connection behind whatever Session or Connection we were given.

Enqueue and the job admin calls run in the caller's transaction. :data:`SessionLike` is what
their sync forms accept and :func:`connection_of` finds the Connection behind it;
:func:`run_async` runs the same sync code for an ``AsyncSession`` or ``AsyncConnection``, inside
SQLAlchemy's greenlet bridge, so each async method is a thin shell around its sync logic: same
statements, same transaction, same per-transaction bookkeeping (keyed by the sync Transaction
objects the async ones wrap).

What goes below SQLAlchemy, to the psycopg connection under the caller's (enqueue's one INSERT,
the COPY of a large ``enqueue_many``), is in :mod:`sa_jobqueue._driver`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, TypeAlias, TypeVar

from sqlalchemy import Connection
from sqlalchemy.exc import (
    DBAPIError,
    DisconnectionError,
    InterfaceError,
    InvalidRequestError,
    MissingGreenlet,
    OperationalError,
    ResourceClosedError,
    SQLAlchemyError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session, scoped_session

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


#: The text of both errors SQLAlchemy raises for a connection it will not use any more. The
#: pool's ``InvalidRequestError`` ("This connection is closed", raised in ``sqlalchemy.pool``)
#: when a connection failed its check at checkout (a ``checkout`` hook raising
#: DisconnectionError: the ping of :func:`sa_jobqueue.database.ping_at_checkout`) and so did
#: the fresh one that replaced it ("Reconnection attempts exhausted on checkout"). A
#: Connection's ``ResourceClosedError`` ("This Connection is closed") from any use of a
#: Connection that is closed: the caller's mistake, except on the Connection SQLAlchemy sets a
#: new engine up with (its first connection: server version, settings), which a lost
#: connection closes, since it may not reconnect; the setup goes on over it when an
#: application's ``handle_error`` hook replaced the driver's error (a pooler or server
#: restarting just then). The other places that raise it (``invalidate()``, ``detach()`` on a
#: closed Connection) are only ever mistakes.
_CHECKOUT_EXHAUSTED: Final = "This connection is closed"
_SETUP_CLOSED: Final = "This Connection is closed"


def lost_and_closed(exc: BaseException) -> bool:
    """Whether ``exc`` is one of SQLAlchemy's "closed" errors that a lost connection causes:
    the pool giving up at checkout, or the setup of an engine's first connection going on
    over the connection a lost connection closed (see ``_SETUP_CLOSED``). Told apart from the
    same messages for a Connection the calling code closed by where they were raised (their
    traceback), so a mistake is never retried."""
    if type(exc) is InvalidRequestError:
        # Exactly this class, this text, and raised by the pool's checkout: its subclasses
        # and its other texts are mistakes in the calling code.
        return str(exc) == _CHECKOUT_EXHAUSTED and _raised_in(exc, "sqlalchemy.pool.")
    if type(exc) is ResourceClosedError:
        return str(exc) == _SETUP_CLOSED and _through(
            exc, "sqlalchemy.engine.create", "first_connect"
        )
    return False


def _raised_in(exc: BaseException, package: str) -> bool:
    """Whether the innermost frame of ``exc``'s traceback is in a module of ``package``."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return str(tb.tb_frame.f_globals.get("__name__", "")).startswith(package)


def _through(exc: BaseException, module: str, function: str) -> bool:
    """Whether ``exc`` was raised under a call of ``module``'s ``function`` (its traceback)."""
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == function and tb.tb_frame.f_globals.get("__name__") == module:
            return True
        tb = tb.tb_next
    return False


def transient(exc: BaseException) -> bool:
    """Whether a failed statement may well succeed if tried again soon: the connection was
    lost or refused, a timeout or a pool exhausted; not an error in the statement itself."""
    if isinstance(exc, DBAPIError):
        # The driver's error: a lost connection, or an operational one (refused, "too many
        # clients", a server shutting down), not the statement's.
        return exc.connection_invalidated or isinstance(exc, (OperationalError, InterfaceError))
    if isinstance(exc, InvalidRequestError):
        # SQLAlchemy's "This connection is closed" after a lost connection; every other
        # InvalidRequestError (ResourceClosedError included) is a mistake in the calling code.
        return lost_and_closed(exc)
    # PoolTimeout: no connection came free in time. DisconnectionError: a connection found
    # lost below SQLAlchemy's statements (at checkout, or during the setup of an engine's
    # first connection: sa_jobqueue.database.guard_dialect_setup).
    return isinstance(exc, (PoolTimeout, DisconnectionError))
