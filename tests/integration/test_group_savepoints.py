"""A group's connection: each job's savepoint rolls back only that job, and is never released.

The group's connection comes from ``group_engine``, whose dialect sends savepoints straight to
the driver and keeps them until the transaction ends; these tests hold it to both halves.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa

from sa_jobqueue.worker._sessions import GroupSession, broken, group_engine

TABLES = sa.MetaData()
ROWS = sa.Table("group_savepoint_rows", TABLES, sa.Column("name", sa.Text, primary_key=True))


@pytest.fixture
def group_conn(tables: sa.Engine) -> Iterator[sa.Connection]:
    """A connection of the group view, in a transaction rolled back after the test."""
    with group_engine(tables).connect() as connection:
        transaction = connection.begin()
        yield connection
        transaction.rollback()


def write(conn: sa.Connection, name: str) -> GroupSession:
    session = GroupSession(conn)
    session.execute(sa.insert(ROWS).values(name=name))
    return session


def names(conn: sa.Connection) -> set[str]:
    return set(conn.execute(sa.select(ROWS.c.name)).scalars())


def test_a_failed_job_between_two_good_ones_loses_only_its_own_writes(
    group_conn: sa.Connection,
) -> None:
    first = write(group_conn, "first")
    first.commit_for_real()
    first.close()
    failed = write(group_conn, "failed")
    with failed.begin_nested():  # a savepoint of the handler's own, inside the job's
        failed.execute(sa.insert(ROWS).values(name="inner"))
    failed.rollback()
    failed.close()
    last = write(group_conn, "last")
    last.commit_for_real()
    last.close()
    assert names(group_conn) == {"first", "last"}


def test_a_succeeded_jobs_savepoint_is_kept_until_the_transaction_ends(
    group_conn: sa.Connection,
) -> None:
    session = write(group_conn, "kept")
    session.commit_for_real()  # SQLAlchemy releases it; the dialect keeps it
    session.close()
    driver = group_conn.connection.driver_connection
    assert driver is not None
    # Releasing it again works only because it is still there.
    driver.execute('RELEASE SAVEPOINT "sa_savepoint_1"')
    assert names(group_conn) == {"kept"}


def test_the_engine_the_view_was_made_from_releases_its_savepoints(tables: sa.Engine) -> None:
    with tables.connect() as conn, conn.begin():
        session = write(conn, "released")
        session.commit_for_real()
        session.close()
        driver = conn.connection.driver_connection
        assert driver is not None
        with pytest.raises(psycopg.errors.InvalidSavepointSpecification):
            driver.execute('RELEASE SAVEPOINT "sa_savepoint_1"')
        conn.rollback()


def test_a_savepoint_the_server_refuses_raises_the_servers_error(
    group_conn: sa.Connection,
) -> None:
    write(group_conn, "before").close()
    with pytest.raises(psycopg.errors.InvalidSavepointSpecification):
        group_conn.dialect.do_rollback_to_savepoint(group_conn, "never_made")


def test_a_savepoint_on_a_lost_connection_raises_an_operational_error_and_reads_as_broken(
    group_conn: sa.Connection, tables: sa.Engine
) -> None:
    write(group_conn, "before").close()
    driver = group_conn.connection.driver_connection
    assert driver is not None
    with tables.connect() as other:
        other.execute(sa.select(sa.func.pg_terminate_backend(driver.info.backend_pid)))
    with pytest.raises(psycopg.OperationalError):
        group_conn.dialect.do_savepoint(group_conn, "after_the_loss")
    assert broken(group_conn)
    group_conn.invalidate()
