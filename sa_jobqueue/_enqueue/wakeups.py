"""Waking idle workers: at most one NOTIFY per queue per transaction.

The inserts send theirs in their own round trip where they can (in the INSERT's RETURNING, or
the id draw before a COPY) and note it here; :func:`wake` sends one for the admin calls that
make a job due.
"""

from __future__ import annotations

import weakref
from typing import Final

from sqlalchemy import Connection
from sqlalchemy.engine.base import Transaction

from .._sql import enqueue as enqueue_sql

#: Queues already notified in a transaction. Keyed weakly by the innermost transaction object,
#: so the entry vanishes with it; a savepoint gets its own entry because a NOTIFY sent inside a
#: savepoint that is rolled back is dropped with it.
_notified: Final[weakref.WeakKeyDictionary[Transaction, set[str]]] = weakref.WeakKeyDictionary()


def sent_notifications(conn: Connection) -> set[str]:
    """The queues already notified in the connection's current (innermost) transaction."""
    txn = conn.get_nested_transaction() or conn.get_transaction()
    if txn is None:
        # Not in a transaction yet: the insert is about to autobegin one. Begin it now so the
        # bookkeeping has a transaction to hang on.
        txn = conn.begin()
    return _notified.setdefault(txn, set())


def wake(conn: Connection, queue: str) -> None:
    """Wake ``queue``'s idle workers when ``conn``'s transaction commits, once per transaction."""
    sent = sent_notifications(conn)
    if queue not in sent:
        conn.execute(enqueue_sql.notify(), {"queue": queue})
        sent.add(queue)
