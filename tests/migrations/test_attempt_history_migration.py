"""Revision sajq_0014 on a database that holds jobs: the column is added without rewriting
the table (its file stays the same), every row keeps its values with no history, and the
downgrade drops the column again."""

from __future__ import annotations

import sqlalchemy as sa

from sa_jobqueue.models import SCHEMA_REVISION, jobs_table
from tests.migrations.test_migrations import VERSION_TABLE, migrate_in_process, versions

j = jobs_table.c
JOBS = jobs_table.name


def table_file(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        query = sa.text("SELECT relfilenode FROM pg_class WHERE relname = :name")
        return int(conn.execute(query, {"name": JOBS}).scalar_one())


def rows(engine: sa.Engine) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        query = sa.text("SELECT id, status, attempts, last_error FROM sa_jobqueue_jobs ORDER BY id")
        return [tuple(r) for r in conn.execute(query)]


def columns(engine: sa.Engine) -> set[str]:
    with engine.connect() as conn:
        return {c["name"] for c in sa.inspect(conn).get_columns(JOBS)}


def test_the_column_is_added_without_a_rewrite(migrated_engine: sa.Engine) -> None:
    migrate_in_process(migrated_engine, "downgrade", "sajq_0013")
    assert "attempt_history" not in columns(migrated_engine)
    with migrated_engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO sa_jobqueue_jobs"
                " (task, payload, status, attempts, finished_at, last_error)"
                " SELECT 't', '{}', 'dead', 1, now(), jsonb_build_object('type', 'E', 'n', n)"
                " FROM generate_series(1, 500) AS n"
            )
        )
    before, file_before = rows(migrated_engine), table_file(migrated_engine)

    migrate_in_process(migrated_engine, "upgrade", "heads")

    assert versions(migrated_engine, VERSION_TABLE) == [SCHEMA_REVISION]
    assert table_file(migrated_engine) == file_before  # no rewrite: the same file
    assert rows(migrated_engine) == before
    with migrated_engine.connect() as conn:
        histories = conn.execute(sa.select(sa.func.count()).where(j.attempt_history.is_not(None)))
        assert histories.scalar_one() == 0

    migrate_in_process(migrated_engine, "downgrade", "sajq_0013")
    assert "attempt_history" not in columns(migrated_engine)
    assert rows(migrated_engine) == before
