"""Where an enqueue's work runs: the caller's transaction, or one of its own for an Engine.

:func:`run_in` and :func:`arun_in` are the only difference between ``enqueue`` and
``aenqueue`` (and the other twins): the same prepared work, run on the Connection behind a
Session or Connection (:func:`sa_jobqueue._binds.connection_of`), on the sync Connection behind
an async one (:func:`sa_jobqueue._binds.run_async`), or in a transaction begun and committed
here for an ``Engine`` or ``AsyncEngine``.

A transaction of its own is a producer's that has no business transaction to join (River's
``Insert`` beside ``InsertTx``). It is tried again when it failed on a transient error (see
:func:`sa_jobqueue._binds.transient`: the connection was lost, or the server refused or
aborted the transaction), :data:`ATTEMPTS` times in all. A failed transaction added nothing,
so trying it again is safe, with one exception: when the connection is lost after the COMMIT
was sent and before its reply came, the jobs may have been committed, and the retry enqueues
them a second time. A unique key makes that retry find the first job instead. Each try runs
the whole work again, middleware included (given the call afresh, as enqueue was given it),
in its new transaction.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from .._binds import _ASYNC_BIND, SessionLike, _outside_bridge, connection_of, run_async, transient

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from .._binds import AsyncSessionLike

T = TypeVar("T")

#: How many times a transaction of its own is tried, at most. A lost connection invalidates
#: the pool it came from (SQLAlchemy then replaces every connection checked out before it), so
#: the second try runs on a new connection: it covers the common case, a pool holding
#: connections a server restart or failover cut. The third, after :data:`PAUSE` seconds,
#: covers a server still coming back. More would hold a producer up for an outage that
#: retrying cannot fix; its error is better raised.
ATTEMPTS: Final = 3

#: Seconds before the third try (the second goes at once, on a fresh connection).
PAUSE: Final = 0.5


def run_in(target: SessionLike | Engine, work: Callable[[Connection], T]) -> T:
    """``work`` in the transaction of ``target`` (a Session or Connection), or in one of its
    own, committed before this returns, for an Engine."""
    if not isinstance(target, Engine):
        return work(connection_of(target))
    if target.dialect.is_async and _outside_bridge():
        raise TypeError(_ASYNC_BIND)
    for attempt in range(1, ATTEMPTS + 1):
        try:
            with target.begin() as conn:
                return work(conn)
        except SQLAlchemyError as exc:
            if not _again(exc, attempt):
                raise
        time.sleep(_pause(attempt))
    raise AssertionError("unreachable: the last attempt returns or raises")


async def arun_in(target: AsyncSessionLike | AsyncEngine, work: Callable[[Connection], T]) -> T:
    """:func:`run_in` for an AsyncSession or AsyncConnection, or an AsyncEngine."""
    from sqlalchemy.ext.asyncio import AsyncEngine  # needs greenlet: async callers only

    if not isinstance(target, AsyncEngine):
        return await run_async(target, work)
    for attempt in range(1, ATTEMPTS + 1):
        try:
            async with target.begin() as conn:
                return await conn.run_sync(work)
        except SQLAlchemyError as exc:
            if not _again(exc, attempt):
                raise
        await asyncio.sleep(_pause(attempt))
    raise AssertionError("unreachable: the last attempt returns or raises")


def _again(exc: SQLAlchemyError, attempt: int) -> bool:
    """Whether a transaction of its own that failed with ``exc`` on try ``attempt`` is tried
    again: a lost connection (the driver's error, or SQLAlchemy's "closed" errors that one
    causes), not a pool whose connections stayed busy for its whole timeout (waiting that long
    again would hold the producer up)."""
    return attempt < ATTEMPTS and transient(exc) and not isinstance(exc, PoolTimeout)


def _pause(attempt: int) -> float:
    """Seconds to wait after try ``attempt`` failed."""
    return 0.0 if attempt == 1 else PAUSE
