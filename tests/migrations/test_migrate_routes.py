"""``sa-jobqueue migrate`` and this repository's ``alembic upgrade head`` meet a database whose
sa_jobqueue schema was installed by another route.

Our revisions can be recorded in our own version table (``sa-jobqueue migrate``, this
repository's alembic.ini) or in an application's ``alembic_version`` (our revisions joined to its
history). Run against the second kind, our own route must not try to create the tables again:
at our head it does nothing and exits 0; behind it, it prints one line naming what it found and
the command to run instead, and exits non-zero. Both are checked through the real commands, in
subprocesses, as a user runs them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL

from sa_jobqueue.migrations import VERSION_TABLE, upgrade
from sa_jobqueue.models import SCHEMA_REVISION, jobs_table
from tests.helpers.databases import url_string

from .test_migrations import REPO_ROOT, run, table_names, versions, write_app_project

APP_VERSION_TABLE = "alembic_version"
#: A revision of the application's own, recorded next to ours in its alembic_version.
APP_REVISION = "app_0001"


def install_in_app_history(engine: sa.Engine, revision: str) -> None:
    """Leave the database as an application's ``alembic upgrade heads`` would: our schema at
    ``revision``, recorded in the application's alembic_version beside a revision of its own."""
    upgrade(engine, revision)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"ALTER TABLE {VERSION_TABLE} RENAME TO {APP_VERSION_TABLE}")
        conn.exec_driver_sql(
            f"ALTER TABLE {APP_VERSION_TABLE}"
            f" RENAME CONSTRAINT {VERSION_TABLE}_pkc TO {APP_VERSION_TABLE}_pkc"
        )
        conn.execute(
            sa.insert(sa.table(APP_VERSION_TABLE, sa.column("version_num"))).values(
                version_num=APP_REVISION
            )
        )
    assert VERSION_TABLE not in table_names(engine)


def schema_snapshot(engine: sa.Engine) -> dict[str, object]:
    """What a second install would disturb: tables, the jobs table's columns, version rows."""
    with engine.connect() as conn:
        inspector = sa.inspect(conn)
        columns = [c["name"] for c in inspector.get_columns(jobs_table.name)]
        names = sorted(inspector.get_table_names())
    return {
        "tables": names,
        "columns": columns,
        "app_versions": versions(engine, APP_VERSION_TABLE),
    }


def migrate_cli(url: URL, cwd: Path) -> tuple[int, str, str]:
    result = run(["-m", "sa_jobqueue", "migrate", "--database-url", url_string(url)], cwd=cwd)
    return result.returncode, result.stdout, result.stderr


def repository_alembic(url: URL) -> tuple[int, str, str]:
    result = run(
        ["-m", "alembic", "-x", f"url={url_string(url)}", "upgrade", "head"], cwd=REPO_ROOT
    )
    return result.returncode, result.stdout, result.stderr


def single_line(stdout: str, stderr: str) -> str:
    """The whole output is one line (on either stream), and not a traceback."""
    assert "Traceback" not in stderr, stderr
    lines = (stdout + stderr).strip().splitlines()
    assert len(lines) == 1, f"--- stdout\n{stdout}\n--- stderr\n{stderr}"
    return lines[0]


def _run_route(route: str, url: URL, cwd: Path) -> tuple[int, str, str]:
    if route == "cli":
        return migrate_cli(url, cwd)
    return repository_alembic(url)


@pytest.mark.parametrize("route", ["cli", "repository-alembic"])
def test_behind_in_the_applications_history_says_what_to_run(
    route: str, tmp_path: Path, empty_database_url: URL, empty_engine: sa.Engine
) -> None:
    install_in_app_history(empty_engine, "sajq_0003")
    before = schema_snapshot(empty_engine)

    status, out, err = _run_route(route, empty_database_url, tmp_path)

    assert status != 0
    line = single_line(out, err)
    assert "sajq_0003" in line  # what it found ...
    assert APP_VERSION_TABLE in line  # ... and where
    assert "alembic upgrade heads" in line  # what to run instead
    if route == "cli":
        assert line.startswith("sa-jobqueue: ")
    assert schema_snapshot(empty_engine) == before
    assert VERSION_TABLE not in table_names(empty_engine)


@pytest.mark.parametrize("route", ["cli", "repository-alembic"])
def test_at_head_in_the_applications_history_is_a_no_op(
    route: str, tmp_path: Path, empty_database_url: URL, empty_engine: sa.Engine
) -> None:
    install_in_app_history(empty_engine, SCHEMA_REVISION)
    before = schema_snapshot(empty_engine)

    status, out, err = _run_route(route, empty_database_url, tmp_path)

    assert status == 0, f"--- stdout\n{out}\n--- stderr\n{err}"
    assert "Traceback" not in err
    assert "Running upgrade" not in err
    assert schema_snapshot(empty_engine) == before
    # Nothing recorded a second time in a version table of ours.
    assert VERSION_TABLE not in table_names(empty_engine)


@pytest.mark.parametrize("route", ["cli", "repository-alembic"])
def test_at_head_by_our_own_route_is_a_no_op(
    route: str, tmp_path: Path, empty_database_url: URL, empty_engine: sa.Engine
) -> None:
    upgrade(empty_engine)
    status, out, err = _run_route(route, empty_database_url, tmp_path)
    assert status == 0, f"--- stdout\n{out}\n--- stderr\n{err}"
    assert "Running upgrade" not in err
    assert versions(empty_engine, VERSION_TABLE) == [SCHEMA_REVISION]


@pytest.mark.parametrize("route", ["cli", "repository-alembic"])
def test_a_revision_newer_than_the_package_says_so(
    route: str, tmp_path: Path, empty_database_url: URL, empty_engine: sa.Engine
) -> None:
    install_in_app_history(empty_engine, SCHEMA_REVISION)
    with empty_engine.begin() as conn:
        versions_table = sa.table(APP_VERSION_TABLE, sa.column("version_num", sa.Text))
        conn.execute(
            sa.update(versions_table)
            .where(versions_table.c.version_num == SCHEMA_REVISION)
            .values(version_num="sajq_9999")
        )

    status, out, err = _run_route(route, empty_database_url, tmp_path)

    assert status != 0
    line = single_line(out, err)
    assert "sajq_9999" in line
    assert "upgrade the sa_jobqueue package" in line


@pytest.mark.parametrize("route", ["cli", "repository-alembic"])
def test_tables_without_a_recorded_revision_are_left_alone(
    route: str, tmp_path: Path, empty_database_url: URL, empty_engine: sa.Engine
) -> None:
    """A schema made by ``metadata.create_all``: no revision anywhere says what it is."""
    from sa_jobqueue.models import metadata

    metadata.create_all(empty_engine)

    status, out, err = _run_route(route, empty_database_url, tmp_path)

    assert status != 0
    if route == "cli":
        line = single_line(out, err)
    else:
        # Alembic's own log lines (this repository's alembic.ini asks for them) come first.
        assert "Traceback" not in err, err
        line = err.strip().splitlines()[-1]
    assert jobs_table.name in line
    assert "stamp" in line
    assert VERSION_TABLE not in table_names(empty_engine)


def test_the_applications_history_refuses_tables_our_route_installed(
    tmp_path: Path, empty_database_url: URL, empty_engine: sa.Engine
) -> None:
    """The mirror case: installed by ``sa-jobqueue migrate``, then upgraded by an application
    whose history our revisions joined. Its alembic_version records none of ours."""
    upgrade(empty_engine)
    app = write_app_project(tmp_path / "shopapp-project")
    url = url_string(empty_database_url)

    result = run(["-m", "alembic", "-x", f"url={url}", "upgrade", "heads"], cwd=app)

    assert result.returncode != 0
    assert "DuplicateTable" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]  # the application's env.py shows a traceback
    assert "SchemaManagedElsewhereError" in last
    assert f"{SCHEMA_REVISION} in {VERSION_TABLE}" in last
    assert "alembic stamp" in last
    assert versions(empty_engine, VERSION_TABLE) == [SCHEMA_REVISION]


def test_migrate_says_what_it_did_created_upgraded_or_nothing(
    tmp_path: Path, empty_database_url: URL, empty_engine: sa.Engine
) -> None:
    status, out, err = migrate_cli(empty_database_url, tmp_path)
    assert status == 0, err
    assert single_line(out, err) == (
        f"sa-jobqueue: created the sa_jobqueue tables at revision {SCHEMA_REVISION}"
    )
    status, out, err = migrate_cli(empty_database_url, tmp_path)
    assert status == 0, err
    assert single_line(out, err) == (
        f"sa-jobqueue: schema is up to date (revision {SCHEMA_REVISION}); nothing to do"
    )


def test_migrate_names_the_revisions_it_upgraded_between(
    tmp_path: Path, empty_database_url: URL, empty_engine: sa.Engine
) -> None:
    upgrade(empty_engine, "sajq_0011")
    status, out, err = migrate_cli(empty_database_url, tmp_path)
    assert status == 0, err
    assert single_line(out, err) == (
        f"sa-jobqueue: upgraded the sa_jobqueue schema from sajq_0011 to {SCHEMA_REVISION}"
    )


def test_migrate_at_head_in_the_applications_history_says_where_it_is_recorded(
    tmp_path: Path, empty_database_url: URL, empty_engine: sa.Engine
) -> None:
    install_in_app_history(empty_engine, SCHEMA_REVISION)
    status, out, err = migrate_cli(empty_database_url, tmp_path)
    assert status == 0, err
    assert single_line(out, err) == (
        f"sa-jobqueue: schema is up to date (revision {SCHEMA_REVISION}, recorded in"
        f" {APP_VERSION_TABLE}); nothing to do"
    )
