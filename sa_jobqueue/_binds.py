"""The caller's transaction: the Connection behind whatever Session or Connection we were given.

Enqueue and the job admin calls run in the caller's transaction. :data:`SessionLike` is what
their sync forms accept and :func:`connection_of` finds the Connection behind it;
:func:`run_async` runs the same sync code for an ``AsyncSession`` or ``AsyncConnection``, inside
SQLAlchemy's greenlet bridge, so each async method is a thin shell around its sync logic: same
statements, same transaction, same per-transaction bookkeeping (keyed by the sync Transaction
objects the async ones wrap).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final, TypeAlias, TypeVar

from sqlalchemy import Connection
from sqlalchemy.exc import MissingGreenlet, SQLAlchemyError
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
    if isinstance(session, Session | scoped_session):
        try:
            bind: object = session.get_bind()
        except SQLAlchemyError:
            bind = None  # no single bind to look at: connection() says what is wrong
        # An asyncio driver works only inside SQLAlchemy's greenlet bridge (the Session that
        # AsyncSession.run_sync hands over); outside it, refuse before connecting, which
        # would fail deep in SQLAlchemy and leave a never-awaited coroutine behind.
        if type(bind).__module__.startswith("sqlalchemy.ext.asyncio") or (
            getattr(getattr(bind, "dialect", None), "is_async", False) and _outside_bridge()
        ):
            raise TypeError(_ASYNC_BIND)
        try:
            return session.connection()
        except MissingGreenlet as exc:  # _outside_bridge could not tell
            raise TypeError(_ASYNC_BIND) from exc
    if isinstance(session, Connection):
        return session
    hint = ""
    if type(session).__module__.startswith("sqlalchemy.ext.asyncio"):
        hint = " (for an AsyncSession or AsyncConnection, await aenqueue, acancel, ...)"
    raise TypeError(
        "enqueue needs a SQLAlchemy Session, scoped_session or Connection,"
        f" not {type(session).__name__}{hint}"
    )


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
