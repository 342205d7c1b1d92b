"""An upgrade that cannot get its lock gives up after the revisions' ``lock_timeout``, rather
than queue every claim and enqueue behind its request for as long as a long transaction holds
the jobs table; the operator runs it again once that transaction is gone."""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext

from sa_jobqueue.errors import MigrationLockTimeoutError
from sa_jobqueue.migrations import VERSION_TABLE, upgrade
from sa_jobqueue.migrations._locks import LOCK_TIMEOUT as SET
from sa_jobqueue.migrations._locks import bound_lock_waits
from sa_jobqueue.models import SCHEMA_REVISION
from tests.helpers.waiting import wait_for
from tests.migrations.test_migrations import migrate_in_process, versions

#: The revisions' lock_timeout (sa_jobqueue.migrations._locks.LOCK_TIMEOUT), in seconds.
LOCK_TIMEOUT = 1.0
#: What a loaded 2-core machine adds to it: thread start, round trips, the poll below.
SLACK = 3.0

ENQUEUE = sa.text("INSERT INTO sa_jobqueue_jobs (task, payload) VALUES ('t', '{}') RETURNING id")
CLAIM = sa.text(
    "UPDATE sa_jobqueue_jobs SET status = 'running', attempts = attempts + 1"
    " WHERE id = (SELECT id FROM sa_jobqueue_jobs WHERE status = 'queued'"
    " ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id"
)
WAITING_FOR_THE_JOBS_TABLE = sa.text(
    "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
    " WHERE c.relname = 'sa_jobqueue_jobs' AND l.mode = 'AccessExclusiveLock' AND NOT l.granted"
)


def test_an_upgrade_behind_a_long_transaction_gives_up_and_holds_claims_up_no_longer(
    migrated_engine: sa.Engine,
) -> None:
    migrate_in_process(migrated_engine, "downgrade", "sajq_0016")
    with migrated_engine.begin() as conn:
        conn.execute(ENQUEUE)
    outcome: list[BaseException | None] = []
    took: list[float] = []

    def run_upgrade() -> None:
        started = time.monotonic()
        try:
            upgrade(migrated_engine)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)
        took.append(time.monotonic() - started)

    # A long report: an open transaction that read the jobs table holds its ACCESS SHARE
    # lock until it ends, which the revision's ALTER TABLE must wait for.
    report = migrated_engine.connect()
    migrating = threading.Thread(target=run_upgrade, daemon=True)
    try:
        report.execute(sa.text("SELECT count(*) FROM sa_jobqueue_jobs"))
        migrating.start()
        with migrated_engine.connect() as watch:
            wait_for(lambda: watch.execute(WAITING_FOR_THE_JOBS_TABLE).scalar_one() > 0, 10)
        # Queued behind the ALTER's request: a claim and an enqueue go on once it gives up.
        held_up = time.monotonic()
        with migrated_engine.begin() as conn:
            # Bounded, so that a claim held up for as long as the report lasts fails here.
            bound = {"ms": str(int((LOCK_TIMEOUT + SLACK) * 1000))}
            conn.execute(sa.text("SELECT set_config('statement_timeout', :ms, true)"), bound)
            assert conn.execute(CLAIM).scalar_one() > 0
            conn.execute(ENQUEUE)
        assert time.monotonic() - held_up < LOCK_TIMEOUT + SLACK
        migrating.join(LOCK_TIMEOUT + SLACK)
        assert not migrating.is_alive(), "the upgrade still waits for its lock"
    finally:
        report.close()
        migrating.join(30)
    (error,) = outcome
    assert isinstance(error, MigrationLockTimeoutError), repr(error)
    assert "run `sa-jobqueue migrate` again" in str(error)
    assert took[0] < LOCK_TIMEOUT + SLACK
    assert versions(migrated_engine, VERSION_TABLE) == ["sajq_0016"]

    upgrade(migrated_engine)  # the report is over: the lock is granted at once
    assert versions(migrated_engine, VERSION_TABLE) == [SCHEMA_REVISION]


@pytest.mark.parametrize("preset", ["0", "250ms"])
def test_the_revisions_lock_timeout_leaves_one_the_session_chose(
    migrated_engine: sa.Engine, preset: str
) -> None:
    """Local to the revision's transaction, and only where the session has none."""
    with migrated_engine.connect() as conn:
        conn.execute(sa.text("SELECT set_config('lock_timeout', :v, false)"), {"v": preset})
        conn.commit()
        with conn.begin(), Operations.context(MigrationContext.configure(conn)):
            bound_lock_waits()
            inside = conn.execute(sa.text("SHOW lock_timeout")).scalar_one()
        after = conn.execute(sa.text("SHOW lock_timeout")).scalar_one()
    assert inside == (SET if preset == "0" else preset)
    assert after == preset
