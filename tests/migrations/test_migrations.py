"""The three ways to install sa_jobqueue's schema, and proof that they build what the models say.

1. ``alembic upgrade head`` from this repository (its alembic.ini and alembic/ environment);
2. our revisions joined to an application's own Alembic history through the package resource
   ``sa_jobqueue:migrations/versions`` (also from a built wheel);
3. ``sa-jobqueue migrate``.

Then: the migrated database has an empty autogenerate diff against ``sa_jobqueue.models``,
workers refuse a database whose schema is missing or of another revision, and the claim uses the
partial claim index even when finished history dwarfs the backlog.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import URL

from sa_jobqueue._sql import claiming
from sa_jobqueue.database import VERSION_TABLES, check_schema, create_engine
from sa_jobqueue.errors import SchemaMissingError, SchemaOutdatedError
from sa_jobqueue.migrations import VERSION_LOCATION, VERSION_TABLE
from sa_jobqueue.models import BRANCH_LABEL, SCHEMA_REVISION, jobs_table, metadata, queues_table
from tests.helpers.databases import url_string
from tests.helpers.processes import REPO_ROOT

JOBS = jobs_table.name
CLAIM_INDEX = "sa_jobqueue_jobs_claim_idx"
MIGRATE_COMMAND = "sa-jobqueue migrate"
SUBPROCESS_TIMEOUT = 100


# -- helpers ------------------------------------------------------------------------------------


def run(
    args: list[str], *, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python <args>`` in a clean environment: no PYTHONPATH, no DATABASE_URL."""
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DATABASE_URL")}
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
        check=False,
    )


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, (
        f"{result.args} exited {result.returncode}\n"
        f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    )
    return result


def table_names(engine: sa.Engine) -> set[str]:
    with engine.connect() as conn:
        return set(sa.inspect(conn).get_table_names())


def version_table(name: str) -> sa.TableClause:
    return sa.table(name, sa.column("version_num", sa.Text))


def versions(engine: sa.Engine, table: str) -> list[str]:
    versions = version_table(table)
    with engine.connect() as conn:
        rows = conn.execute(sa.select(versions.c.version_num).order_by(versions.c.version_num))
        return list(rows.scalars())


def set_version(engine: sa.Engine, table: str, revision: str | None) -> None:
    """Overwrite the revision a version table records (None: delete the row)."""
    versions = version_table(table)
    with engine.begin() as conn:
        if revision is None:
            conn.execute(sa.delete(versions))
        else:
            conn.execute(sa.update(versions).values(version_num=revision))


def package_config() -> Config:
    """An Alembic config for our revisions alone, as ``sa_jobqueue.migrations.upgrade`` uses."""
    config = Config()
    config.set_main_option("script_location", "sa_jobqueue:migrations")
    config.set_main_option("path_separator", "space")
    config.set_main_option("version_locations", VERSION_LOCATION)
    return config


def migrate_in_process(engine: sa.Engine, direction: str, revision: str) -> None:
    config = package_config()
    with engine.connect() as conn:
        config.attributes["connection"] = conn
        getattr(command, direction)(config, revision)


# -- 1. alembic upgrade head from this repository -----------------------------------------------


@pytest.mark.parametrize("how", ["x-argument", "x-argument-plain-url", "DATABASE_URL"])
def test_repository_alembic_upgrade_head(
    how: str, empty_database_url: URL, empty_engine: sa.Engine
) -> None:
    url = url_string(empty_database_url)
    if how == "x-argument-plain-url":
        # What users type: no driver. The env must still pick psycopg 3, not psycopg2.
        url = url_string(empty_database_url.set(drivername="postgresql"))
    assert JOBS not in table_names(empty_engine)
    if how == "DATABASE_URL":
        result = run(["-m", "alembic", "upgrade", "head"], cwd=REPO_ROOT, env={"DATABASE_URL": url})
    else:
        result = run(["-m", "alembic", "-x", f"url={url}", "upgrade", "head"], cwd=REPO_ROOT)
    ok(result)
    assert f"-> {SCHEMA_REVISION}" in result.stderr  # alembic's "Running upgrade" log line

    assert JOBS in table_names(empty_engine)
    check_schema(empty_engine)
    assert versions(empty_engine, VERSION_TABLE) == [SCHEMA_REVISION]
    # Our own version table only: an application's alembic_version is never created or touched.
    assert "alembic_version" not in table_names(empty_engine)

    # `alembic current` agrees, and a second upgrade does nothing.
    current = ok(run(["-m", "alembic", "-x", f"url={url}", "current"], cwd=REPO_ROOT))
    assert f"{SCHEMA_REVISION} (head)" in current.stdout
    again = ok(run(["-m", "alembic", "-x", f"url={url}", "upgrade", "head"], cwd=REPO_ROOT))
    assert "Running upgrade" not in again.stderr
    assert versions(empty_engine, VERSION_TABLE) == [SCHEMA_REVISION]


def test_repository_alembic_without_a_database_says_so() -> None:
    result = run(["-m", "alembic", "upgrade", "head"], cwd=REPO_ROOT)
    assert result.returncode != 0
    assert "no database" in result.stderr


# -- 2. our revisions inside an application's own Alembic environment ---------------------------

APP_INI = """\
[alembic]
script_location = %(here)s/migrations
path_separator = space
version_locations = %(here)s/migrations/versions sa_jobqueue:migrations/versions
prepend_sys_path = .

[loggers]
keys = root,alembic

[handlers]
keys = console

[formatters]
keys = generic

[logger_root]
level = WARNING
handlers = console
qualname =

[logger_alembic]
level = INFO
handlers =
qualname = alembic

[handler_console]
class = StreamHandler
args = (sys.stderr,)
level = NOTSET
formatter = generic

[formatter_generic]
format = %(levelname)-5.5s [%(name)s] %(message)s
"""

APP_MODELS = '''\
"""The models of shopapp, a fictional application that uses sa_jobqueue."""

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "app_orders"

    id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True)
    customer: Mapped[str] = mapped_column(sa.Text)
'''

APP_ENV = '''\
"""shopapp's Alembic environment: its own revisions and sa_jobqueue's, one history."""

from logging.config import fileConfig

import sqlalchemy as sa
from alembic import context

import sa_jobqueue.models
import shopapp.models

config = context.config
if config.config_file_name is not None:
    fileConfig(config.config_file_name)

target_metadata = [shopapp.models.Base.metadata, sa_jobqueue.models.metadata]


def run_migrations_online():
    url = context.get_x_argument(as_dictionary=True)["url"]
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


run_migrations_online()
'''

APP_SCRIPT_MAKO = '''\
"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}
"""

import sqlalchemy as sa
from alembic import op
${imports if imports else ""}
revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = ${repr(branch_labels)}
depends_on = ${repr(depends_on)}


def upgrade():
    ${upgrades if upgrades else "pass"}


def downgrade():
    ${downgrades if downgrades else "pass"}
'''

APP_REVISION = '''\
"""orders

Revision ID: app_0001
Revises:
Create Date: 2026-01-01
"""

import sqlalchemy as sa
from alembic import op

revision = "app_0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        "app_orders",
        sa.Column("id", sa.BigInteger(), primary_key=True),
        sa.Column("customer", sa.Text(), nullable=False),
    )


def downgrade():
    op.drop_table("app_orders")
'''


def write_app_project(root: Path) -> Path:
    """Lay out shopapp's project: alembic.ini, migrations/ and the shopapp package."""
    (root / "migrations" / "versions").mkdir(parents=True)
    (root / "alembic.ini").write_text(APP_INI)
    (root / "migrations" / "env.py").write_text(APP_ENV)
    (root / "migrations" / "script.py.mako").write_text(APP_SCRIPT_MAKO)
    (root / "migrations" / "versions" / "app_0001_orders.py").write_text(APP_REVISION)
    (root / "shopapp").mkdir()
    (root / "shopapp" / "__init__.py").write_text("")
    (root / "shopapp" / "models.py").write_text(APP_MODELS)
    return root


PROBE = """\
import importlib.resources, json, sys
import sa_jobqueue
versions = importlib.resources.files("sa_jobqueue") / "migrations" / "versions"
print(json.dumps({
    "sys_path": sys.path,
    "package": sa_jobqueue.__file__,
    "revisions": sorted(p.name for p in versions.iterdir() if p.name.endswith(".py")),
}))
"""


def probe(cwd: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(ok(run(["-c", PROBE], cwd=cwd, env=env)).stdout)
    return result


def test_joined_to_an_application_alembic_history(
    tmp_path: Path, empty_database_url: URL, empty_engine: sa.Engine
) -> None:
    app = write_app_project(tmp_path / "shopapp-project")
    url = url_string(empty_database_url)

    # The subprocesses below see sa_jobqueue as an installed package, not as the checkout's
    # directory: the repository root is not on their sys.path.
    found = probe(app)
    assert str(REPO_ROOT) not in [str(Path(p or app).resolve()) for p in found["sys_path"]]
    assert any(re.fullmatch(rf"{SCHEMA_REVISION}_\w+\.py", n) for n in found["revisions"])

    heads = ok(run(["-m", "alembic", "heads"], cwd=app)).stdout
    assert f"{SCHEMA_REVISION} ({BRANCH_LABEL}) (head)" in heads
    assert "app_0001 (head)" in heads

    upgraded = ok(run(["-m", "alembic", "-x", f"url={url}", "upgrade", "heads"], cwd=app))
    assert f"-> {SCHEMA_REVISION}" in upgraded.stderr
    assert "-> app_0001" in upgraded.stderr

    assert {"app_orders", JOBS} <= table_names(empty_engine)
    assert versions(empty_engine, "alembic_version") == sorted(["app_0001", SCHEMA_REVISION])
    # In this setup the application's alembic_version is the only version table.
    assert VERSION_TABLE not in table_names(empty_engine)
    check_schema(empty_engine)

    # The application's autogenerate, fed both metadatas, sees nothing to do.
    checked = ok(run(["-m", "alembic", "-x", f"url={url}", "check"], cwd=app))
    assert "No new upgrade operations detected" in checked.stdout + checked.stderr

    # A revision of ours recorded in the application's version table is still checked.
    app_versions = version_table("alembic_version")
    with empty_engine.begin() as conn:
        conn.execute(
            sa.update(app_versions)
            .where(app_versions.c.version_num == SCHEMA_REVISION)
            .values(version_num="sajq_0000")
        )
    with pytest.raises(SchemaOutdatedError, match=MIGRATE_COMMAND):
        check_schema(empty_engine)


def test_package_resource_resolves_in_process() -> None:
    versions_dir = importlib.resources.files("sa_jobqueue") / "migrations" / "versions"
    names = [p.name for p in versions_dir.iterdir()]
    assert any(re.fullmatch(rf"{SCHEMA_REVISION}_\w+\.py", n) for n in names)
    script = ScriptDirectory.from_config(package_config())
    assert script.get_heads() == [SCHEMA_REVISION]


@pytest.mark.slow
def test_wheel_carries_the_migrations(tmp_path: Path, empty_database_url: URL) -> None:
    # Build from a copy of the sources, so the build leaves nothing behind in the checkout.
    source = tmp_path / "source"
    source.mkdir()
    shutil.copy(REPO_ROOT / "pyproject.toml", source)
    shutil.copy(REPO_ROOT / "README.md", source)
    shutil.copytree(
        REPO_ROOT / "sa_jobqueue",
        source / "sa_jobqueue",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    out = tmp_path / "dist"
    ok(run(["-m", "pip", "wheel", "--no-deps", "-w", str(out), str(source)], cwd=tmp_path))
    (wheel,) = out.glob("sa_jobqueue-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        zf.extractall(tmp_path / "installed")
    assert any(
        re.fullmatch(rf"sa_jobqueue/migrations/versions/{SCHEMA_REVISION}_\w+\.py", n)
        for n in names
    ), names
    for required in (
        "sa_jobqueue/migrations/__init__.py",
        "sa_jobqueue/migrations/env.py",
        "sa_jobqueue/migrations/script.py.mako",
        "sa_jobqueue/py.typed",
    ):
        assert required in names

    # With the unpacked wheel first on the path, an application's Alembic environment takes our
    # revisions from the wheel's files, and `sa-jobqueue migrate` from it works too.
    installed = {"PYTHONPATH": str(tmp_path / "installed")}
    app = write_app_project(tmp_path / "shopapp-project")
    found = probe(app, env=installed)
    assert Path(found["package"]).is_relative_to(tmp_path / "installed")
    heads = ok(run(["-m", "alembic", "heads", "--verbose"], cwd=app, env=installed)).stdout
    assert str(tmp_path / "installed" / "sa_jobqueue" / "migrations" / "versions") in heads
    url = url_string(empty_database_url)
    ok(run(["-m", "sa_jobqueue", "migrate", "--database-url", url], cwd=app, env=installed))
    engine = create_engine(empty_database_url, poolclass=sa.pool.NullPool)
    try:
        check_schema(engine)
    finally:
        engine.dispose()


# -- 3. sa-jobqueue migrate ----------------------------------------------------------------------


@pytest.mark.parametrize("driver", ["postgresql+psycopg", "postgresql", "postgres"])
def test_cli_migrate_installs_then_does_nothing(
    driver: str, tmp_path: Path, empty_database_url: URL, empty_engine: sa.Engine
) -> None:
    url = url_string(empty_database_url.set(drivername=driver))
    # Alembic's "Running upgrade" lines are logged at INFO only when asked for.
    migrate = ["-m", "sa_jobqueue", "--log-level", "INFO", "migrate", "--database-url", url]
    first = run(migrate, cwd=tmp_path)
    ok(first)
    assert "Traceback" not in first.stderr
    assert f"-> {SCHEMA_REVISION}" in first.stderr
    check_schema(empty_engine)
    assert versions(empty_engine, VERSION_TABLE) == [SCHEMA_REVISION]

    with empty_engine.begin() as conn:
        conn.execute(sa.insert(jobs_table).values(task="t", payload={"kept": True}))

    second = run(migrate, cwd=tmp_path)
    ok(second)
    assert "Running upgrade" not in second.stderr
    assert versions(empty_engine, VERSION_TABLE) == [SCHEMA_REVISION]
    with empty_engine.connect() as conn:
        assert conn.execute(sa.select(jobs_table.c.payload)).scalars().all() == [{"kept": True}]


def test_cli_migrate_via_database_url_variable(
    tmp_path: Path, empty_database_url: URL, empty_engine: sa.Engine
) -> None:
    ok(
        run(
            ["-m", "sa_jobqueue", "migrate"],
            cwd=tmp_path,
            env={"DATABASE_URL": url_string(empty_database_url)},
        )
    )
    check_schema(empty_engine)


def test_cli_migrate_on_a_migrated_database_is_a_no_op(
    tmp_path: Path, database_url: URL, migrated_engine: sa.Engine
) -> None:
    result = ok(
        run(
            ["-m", "sa_jobqueue", "migrate", "--database-url", url_string(database_url)],
            cwd=tmp_path,
        )
    )
    assert "Running upgrade" not in result.stderr
    assert versions(migrated_engine, VERSION_TABLE) == [SCHEMA_REVISION]


# -- 4. the models and the revisions agree -------------------------------------------------------


def _not_a_version_table(name: str | None, type_: str, parent_names: Any) -> bool:
    return not (type_ == "table" and name in VERSION_TABLES)


def autogenerate_diff(engine: sa.Engine, **opts: Any) -> list[Any]:
    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"include_name": _not_a_version_table, **opts}
        )
        return list(compare_metadata(context, metadata))


def test_migrated_database_matches_the_models(migrated_engine: sa.Engine) -> None:
    assert autogenerate_diff(migrated_engine) == []


def test_migrated_database_matches_the_models_server_defaults_included(
    migrated_engine: sa.Engine,
) -> None:
    assert autogenerate_diff(migrated_engine, compare_server_default=True) == []


def test_autogenerate_sees_a_difference(migrated_engine: sa.Engine) -> None:
    """The comparison above is not vacuous: a dropped index and column show up."""
    with migrated_engine.begin() as conn:
        conn.exec_driver_sql(f"DROP INDEX {CLAIM_INDEX}")
        conn.exec_driver_sql(f"ALTER TABLE {JOBS} DROP COLUMN last_error")
    diff = autogenerate_diff(migrated_engine)
    kinds = {(d[0], getattr(d[1], "name", None)) for d in diff if isinstance(d, tuple)}
    assert ("add_index", CLAIM_INDEX) in kinds
    assert any(d[0] == "add_column" and d[3].name == "last_error" for d in diff)


@pytest.mark.parametrize("ini", ["repository alembic.ini", "package"])
def test_head_is_the_schema_revision(ini: str) -> None:
    config = package_config() if ini == "package" else Config(str(REPO_ROOT / "alembic.ini"))
    script = ScriptDirectory.from_config(config)
    assert script.get_heads() == [SCHEMA_REVISION]
    head = script.get_revision(SCHEMA_REVISION)
    assert head is not None
    assert head.branch_labels == {BRANCH_LABEL}
    assert script.get_revision(f"{BRANCH_LABEL}@head") is head
    # Every revision of ours is named so it cannot collide with an application's ids.
    assert all(rev.revision.startswith("sajq_") for rev in script.walk_revisions())


def test_downgrade_to_base_and_upgrade_again(migrated_engine: sa.Engine) -> None:
    migrate_in_process(migrated_engine, "downgrade", "base")
    assert JOBS not in table_names(migrated_engine)
    assert versions(migrated_engine, VERSION_TABLE) == []
    with pytest.raises(SchemaMissingError):
        check_schema(migrated_engine)

    migrate_in_process(migrated_engine, "upgrade", "heads")
    check_schema(migrated_engine)
    assert versions(migrated_engine, VERSION_TABLE) == [SCHEMA_REVISION]
    assert autogenerate_diff(migrated_engine) == []


# -- 5. workers refuse a database without the right schema ---------------------------------------


def test_check_schema_missing(empty_engine: sa.Engine) -> None:
    with pytest.raises(SchemaMissingError, match=MIGRATE_COMMAND):
        check_schema(empty_engine)


def test_check_schema_older_revision(migrated_engine: sa.Engine) -> None:
    set_version(migrated_engine, VERSION_TABLE, "sajq_0000")
    with pytest.raises(SchemaOutdatedError, match=MIGRATE_COMMAND) as caught:
        check_schema(migrated_engine)
    assert "sajq_0000" in str(caught.value)


def test_check_schema_newer_revision(migrated_engine: sa.Engine) -> None:
    set_version(migrated_engine, VERSION_TABLE, "sajq_9999")
    with pytest.raises(SchemaOutdatedError, match="upgrade the package") as caught:
        check_schema(migrated_engine)
    assert "sajq_9999" in str(caught.value)
    assert MIGRATE_COMMAND not in str(caught.value)  # migrating would not help


def test_check_schema_missing_column_without_version_row(migrated_engine: sa.Engine) -> None:
    set_version(migrated_engine, VERSION_TABLE, None)
    with migrated_engine.begin() as conn:
        conn.exec_driver_sql(f"ALTER TABLE {JOBS} DROP COLUMN worker")
    with pytest.raises(SchemaOutdatedError, match=MIGRATE_COMMAND) as caught:
        check_schema(migrated_engine)
    assert "worker" in str(caught.value)


def test_check_schema_accepts_create_all(empty_engine: sa.Engine) -> None:
    """A schema made with ``metadata.create_all`` (no version table) is checked by columns."""
    metadata.create_all(empty_engine)
    check_schema(empty_engine)


def test_worker_refuses_a_database_without_the_schema(empty_engine: sa.Engine) -> None:
    from sa_jobqueue import JobQueue, Worker

    with pytest.raises(SchemaMissingError, match=MIGRATE_COMMAND):
        Worker(JobQueue(), empty_engine).run(burst=True)


def test_cli_worker_refuses_a_database_without_the_schema(empty_database_url: URL) -> None:
    result = run(
        [
            "-m",
            "sa_jobqueue",
            "worker",
            "tests.acceptance.test_smoke:queue",
            "--database-url",
            url_string(empty_database_url),
        ],
        cwd=REPO_ROOT,
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert MIGRATE_COMMAND in lines[0]
    assert lines[0].startswith("sa-jobqueue: ")


# -- 6. the claim uses the partial index ---------------------------------------------------------


def _plan_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from _plan_nodes(child)


def _assert_uses_claim_index(plan_json: Any) -> None:
    (top,) = plan_json
    nodes = list(_plan_nodes(top["Plan"]))
    described = json.dumps(top["Plan"], indent=1)
    assert any(n.get("Index Name") == CLAIM_INDEX for n in nodes), described
    assert not any(
        n["Node Type"] == "Seq Scan" and n.get("Relation Name") == JOBS for n in nodes
    ), described


@pytest.fixture
def big_history(migrated_engine: sa.Engine) -> sa.Engine:
    """50,000 finished jobs and a handful of due ones, analysed."""
    with migrated_engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO sa_jobqueue_jobs (queue, task, payload, status, attempts, finished_at)"
            " SELECT 'default', 'record', jsonb_build_object('n', n), 'succeeded', 1, now()"
            " FROM generate_series(1, 50000) AS n"
        )
        conn.exec_driver_sql(
            "INSERT INTO sa_jobqueue_jobs (queue, task, payload, visible_at)"
            " SELECT 'default', 'record', jsonb_build_object('n', n), now() - interval '1 minute'"
            " FROM generate_series(1, 5) AS n"
        )
    with migrated_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(f"ANALYZE {JOBS}")
    return migrated_engine


CLAIM_PARAMS = {"from_queue": "default", "limit": 10, "worker": "explain-test"}
#: The claim from the head, and the claim past a position (with the position it starts past).
CLAIMS = {
    "claim": (claiming.claim, CLAIM_PARAMS),
    "claim_after": (
        claiming.claim_after,
        {**CLAIM_PARAMS, "after_priority": 0, "after_visible_at": "2000-01-01", "after_id": 0},
    ),
}


def _nothing_claimed(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        statuses = conn.execute(
            sa.select(jobs_table.c.status, sa.func.count()).group_by(jobs_table.c.status)
        ).all()
    assert dict(statuses) == {"succeeded": 50000, "queued": 5}


def _sql_literal(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"no literal for {value!r}")
    return str(value) if isinstance(value, int) else "'" + value.replace("'", "''") + "'"


@pytest.mark.parametrize("claim", sorted(CLAIMS))
def test_claim_uses_the_partial_index(big_history: sa.Engine, claim: str) -> None:
    """The claim as the worker sends it: psycopg binds the values, the planner sees them."""
    statement, params = CLAIMS[claim]
    with big_history.connect() as conn, conn.begin() as tx:
        compiled = statement().compile(dialect=conn.dialect)
        plan = conn.exec_driver_sql(
            f"EXPLAIN (FORMAT JSON) {compiled.string}", compiled.construct_params(params)
        ).scalar_one()
        tx.rollback()
    _assert_uses_claim_index(plan)
    _nothing_claimed(big_history)


@pytest.mark.parametrize("claim", sorted(CLAIMS))
def test_claim_uses_the_partial_index_in_a_generic_plan(big_history: sa.Engine, claim: str) -> None:
    """As a prepared statement planned without its parameters' values (psycopg prepares the
    statements it runs often), the claim still matches the partial index's predicate."""
    from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

    statement, params = CLAIMS[claim]
    # $n placeholders, each with a cast, so PREPARE can infer every parameter's type.
    compiled = statement().compile(dialect=PGDialect_psycopg(paramstyle="numeric_dollar"))
    assert compiled.positiontup is not None
    assert {"from_queue", "limit", "worker"} <= set(compiled.positiontup)
    values = compiled.construct_params(params)
    arguments = ", ".join(_sql_literal(values[name]) for name in compiled.positiontup)
    with big_history.connect() as conn, conn.begin() as tx:
        conn.exec_driver_sql("SET LOCAL plan_cache_mode = force_generic_plan")
        conn.exec_driver_sql(f"PREPARE sajq_claim AS {compiled.string}")
        plan = conn.exec_driver_sql(
            f"EXPLAIN (FORMAT JSON) EXECUTE sajq_claim ({arguments})"
        ).scalar_one()
        tx.rollback()
    _assert_uses_claim_index(plan)
    _nothing_claimed(big_history)


def test_a_paused_queue_is_answered_before_the_job_scan_starts(big_history: sa.Engine) -> None:
    """The paused-queue probe runs once per claim, ahead of the claim index's scan (a One-Time
    Filter over an InitPlan): on a paused queue that scan never runs."""
    with big_history.connect() as conn, conn.begin() as tx:
        conn.execute(sa.insert(queues_table).values(queue="default", paused_at=sa.func.now()))
        compiled = claiming.claim().compile(dialect=conn.dialect)
        plan = conn.exec_driver_sql(
            f"EXPLAIN (ANALYZE, FORMAT JSON) {compiled.string}",
            compiled.construct_params(CLAIM_PARAMS),
        ).scalar_one()
        tx.rollback()
    (top,) = plan
    nodes = list(_plan_nodes(top["Plan"]))
    (scan,) = [n for n in nodes if n.get("Index Name") == CLAIM_INDEX]
    assert scan["Actual Loops"] == 0, json.dumps(top["Plan"], indent=1)
    assert top["Plan"]["Actual Rows"] == 0
    _nothing_claimed(big_history)


def test_a_worker_refuses_a_database_one_revision_behind(empty_database_url: URL) -> None:
    from sa_jobqueue.migrations import upgrade

    engine = create_engine(empty_database_url, poolclass=sa.pool.NullPool)
    try:
        upgrade(engine, "sajq_0001")
        with pytest.raises(SchemaOutdatedError, match="sa-jobqueue migrate"):
            check_schema(engine)
        upgrade(engine)
        check_schema(engine)
    finally:
        engine.dispose()


def test_migrated_constraint_names_are_the_models_names(database_url: URL) -> None:
    engine = create_engine(database_url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            found = set(
                conn.execute(
                    sa.text(
                        "SELECT conname FROM pg_constraint"
                        " WHERE conrelid = 'sa_jobqueue_jobs'::regclass"
                    )
                ).scalars()
            )
    finally:
        engine.dispose()
    expected = {c.name for c in jobs_table.constraints}
    assert found == expected
