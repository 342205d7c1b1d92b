"""Revision sajq_0013 on a database that already holds what it forbids: a waiting job beside
another live job of its task with the same unique key. The upgrade does not fail and deletes
nothing: each such waiting job ends cancelled (UniqueConflict, naming the job that keeps the
key), its dependents follow their edges, and the downgrade goes back."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from sa_jobqueue.models import SCHEMA_REVISION, dependencies_table, jobs_table
from tests.migrations.test_migrations import VERSION_TABLE, migrate_in_process, versions

j = jobs_table.c


def add(conn: sa.Connection, status: str, key: str | None = None, task: str = "t") -> int:
    row = {"queue": "q", "task": task, "payload": {}, "status": status, "unique_key": key}
    return int(conn.execute(jobs_table.insert().values(row).returning(j.id)).scalar_one())


def wait(conn: sa.Connection, job_id: int, on: int, on_failure: str = "cancel") -> None:
    edge = {"job_id": job_id, "depends_on": on, "on_failure": on_failure, "pending": True}
    conn.execute(dependencies_table.insert().values(edge))


def jobs(engine: sa.Engine) -> dict[int, Any]:
    with engine.connect() as conn:
        return {r.id: r for r in conn.execute(sa.select(j.id, j.status, j.last_error))}


def unique_index(engine: sa.Engine) -> str:
    with engine.connect() as conn:
        query = "SELECT indexdef FROM pg_indexes WHERE indexname = 'sa_jobqueue_jobs_unique_idx'"
        return str(conn.exec_driver_sql(query).scalar_one())


def test_waiting_duplicates_are_cancelled_and_nothing_is_deleted(
    migrated_engine: sa.Engine,
) -> None:
    migrate_in_process(migrated_engine, "downgrade", "sajq_0012")
    with migrated_engine.begin() as conn:
        dep = add(conn, "queued")
        behind_queued = add(conn, "waiting", "k")  # enqueued first, waits: no key held then
        holder = add(conn, "queued", "k")
        first = add(conn, "waiting", "k2")  # two waiting, nothing else: the first keeps it
        second = add(conn, "waiting", "k2")
        other_task = add(conn, "waiting", "k", task="u")  # keys are per task
        cancelled_after = add(conn, "waiting")  # waits for a duplicate, edge cancels
        runs_after = add(conn, "waiting")  # waits for a duplicate, edge runs
        for job_id in (behind_queued, first, second, other_task):
            wait(conn, job_id, dep)
        wait(conn, cancelled_after, behind_queued)
        wait(conn, runs_after, second, on_failure="run")
    before = jobs(migrated_engine)

    migrate_in_process(migrated_engine, "upgrade", "heads")

    assert versions(migrated_engine, VERSION_TABLE) == [SCHEMA_REVISION]
    after = jobs(migrated_engine)
    assert after.keys() == before.keys()
    assert {i: r.status for i, r in after.items()} == {
        dep: "queued",
        behind_queued: "cancelled",
        holder: "queued",
        first: "waiting",
        second: "cancelled",
        other_task: "waiting",
        cancelled_after: "cancelled",
        runs_after: "queued",
    }
    assert after[behind_queued].last_error == {
        "type": "UniqueConflict",
        "message": f"its unique key is held by job {holder}",
    }
    assert after[second].last_error["message"] == f"its unique key is held by job {first}"
    assert after[cancelled_after].last_error["type"] == "DependencyFailed"
    assert "'waiting'" in unique_index(migrated_engine)

    migrate_in_process(migrated_engine, "downgrade", "sajq_0012")
    assert "'waiting'" not in unique_index(migrated_engine)
    migrate_in_process(migrated_engine, "upgrade", "heads")
    assert jobs(migrated_engine).keys() == before.keys()
