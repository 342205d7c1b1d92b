"""What a handler's database work runs in: its Session, and the checks on its connection.

The handler's Session (whose ``commit()`` only flushes), the savepoint Session of a job that
shares its thread's transaction, payload decoding, and the two questions the worker asks a
handler's connection: how long may the completion take, and is the transaction in error.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from psycopg.pq import TransactionStatus
from sqlalchemy import Connection
from sqlalchemy.orm import Session

from .._deadlines import DEADLINES
from ..errors import PayloadError


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


class GroupSession(HandlerSession):
    """The Session of a job that shares its thread's transaction with other jobs.

    Its transaction is a savepoint of the shared one (``join_transaction_mode=
    "create_savepoint"``): ``rollback()``, a failed flush, or closing it without
    :meth:`commit_for_real` rolls back to the savepoint, this job's writes only; the shared
    transaction is committed by the worker, never by the session.
    """

    def __init__(self, bind: Connection) -> None:
        super().__init__(bind=bind, join_transaction_mode="create_savepoint")


def decode(payload: str) -> Any:
    """The job's payload from the JSON text the claim returned."""
    try:
        return json.loads(payload)
    except (ValueError, RecursionError) as exc:
        raise PayloadError(f"the payload could not be decoded: {type(exc).__name__}") from exc


def deadline(conn: Connection) -> contextlib.AbstractContextManager[None]:
    """The worker's client-side deadline for its completion on a handler's connection."""
    return DEADLINES.guard(conn.connection.dbapi_connection)


def aborted(conn: Connection) -> bool:
    """Whether the connection's transaction is in error: only a rollback is accepted now."""
    driver = conn.connection.driver_connection
    return bool(driver is not None and driver.info.transaction_status == TransactionStatus.INERROR)
