"""How long our revisions wait for a lock: every revision's first statement bounds it.

A revision that alters the jobs table (or the queues table, which limited claims lock) asks
for an ACCESS EXCLUSIVE lock on it. PostgreSQL grants locks in order: while that request waits
for a transaction that holds any lock on the table (a long report, an idle-in-transaction
session), every claim, enqueue and completion that comes after it waits behind it too, and
the queue stops for as long as that transaction lasts. With a ``lock_timeout`` the revision
gives up instead, after :data:`LOCK_TIMEOUT`, its transaction is rolled back, the workers go
on, and the operator runs the upgrade again (:class:`~sa_jobqueue.errors.MigrationLockTimeoutError`
from ``sa-jobqueue migrate``; PostgreSQL's ``LockNotAvailable``, SQLSTATE 55P03, from an
application's own Alembic).

It is set by the revisions themselves, so that it holds however they are run: by
``sa-jobqueue migrate``, by this repository's ``alembic``, or from an application's own
Alembic history, whose env.py knows nothing of it. A ``lock_timeout`` the session already has
(``PGOPTIONS='-c lock_timeout=10s'``, ``ALTER ROLE ... SET lock_timeout``, an env.py's own
``SET``) is left as it is: the operator chose it. The setting is local to the revision's
transaction (``set_config(..., true)``): the application's session gets back its own at the
end, and an autocommit block (CREATE INDEX CONCURRENTLY, which takes no lock that holds up the
queue) runs without it.
"""

from __future__ import annotations

from typing import Final

from alembic import op

#: How long a revision's statement waits for a lock before the revision gives up. One second:
#: claims and enqueues queued behind the waiting request are held up for at most that long
#: (the drain's stall while the revision waits), and a queue's own transactions, each a few
#: milliseconds, never hold a lock for that long, so only a long transaction makes it run out.
LOCK_TIMEOUT: Final = "1s"

# current_setting() says '0' for "no timeout" (the default); any other value was set by
# someone and is kept. The SELECT returns a row either way; op.execute discards it.
_BOUND_LOCK_WAITS: Final = (
    "SELECT set_config('lock_timeout', '" + LOCK_TIMEOUT + "', true)"
    " WHERE current_setting('lock_timeout') = '0'"
)


def bound_lock_waits() -> None:
    """Give this revision's transaction a ``lock_timeout`` of :data:`LOCK_TIMEOUT`, unless the
    session has one already. The first statement of each revision's upgrade and downgrade."""
    op.execute(_BOUND_LOCK_WAITS)
