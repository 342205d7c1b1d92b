"""The README's third way, end to end: sa_jobqueue's revisions inside the user's own Alembic
history, with sa_jobqueue installed from a built wheel into a fresh virtualenv.

A user project in a temporary directory, with models and an Alembic history of its own, follows
the README: its alembic.ini gets the keys the README lists, its env.py is the README's env.py.
Then it autogenerates twice, upgrades, and checks. What must hold:

* every revision the user generates lands in the user's versions directory, never inside the
  installed package, and revises the user's own head (the first one starts a new base);
* the user's revisions never touch sa_jobqueue's tables (autogenerate does not diff them);
* ``alembic upgrade heads`` applies both histories and ``alembic check`` finds nothing to do.

Both starting points are covered: a project that starts fresh (``alembic init``), and a project
with an existing history that adds sa_jobqueue to it.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL

from sa_jobqueue.database import check_schema
from sa_jobqueue.models import SCHEMA_REVISION
from tests.helpers.databases import url_string
from tests.helpers.processes import REPO_ROOT

pytestmark = pytest.mark.slow

README = REPO_ROOT / "README.md"
# The instructions this test follows: the Alembic how-to guide of the documentation.
GUIDE = REPO_ROOT / "docs" / "how-to" / "alembic.md"
SUBPROCESS_TIMEOUT = 120
OUR_TABLES = (
    "sa_jobqueue_jobs",
    "sa_jobqueue_periodic",
    "sa_jobqueue_queues",
    "sa_jobqueue_workers",
)


# -- the installed package: a wheel built from this checkout, in a fresh virtualenv ------------


def _run(args: list[str], cwd: Path, *, check: bool = True) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DATABASE_URL")}
    result = subprocess.run(
        args,
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
        check=False,
    )
    assert result.returncode == 0 or not check, (
        f"{args} exited {result.returncode}\n"
        f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    )
    return result


@dataclass(frozen=True)
class Venv:
    root: Path

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @cached_property
    def our_versions(self) -> Path:
        """The installed package's versions directory, as the venv's Python resolves it (once:
        the venv's packages do not move)."""
        found = _run(
            [
                str(self.bin / "python"),
                "-c",
                "import importlib.resources as r;"
                " print(r.files('sa_jobqueue') / 'migrations' / 'versions')",
            ],
            cwd=self.root,
        )
        return Path(found.stdout.strip())


@pytest.fixture(scope="session")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """A fresh virtualenv with sa_jobqueue installed from a wheel of this checkout (built once
    per session, from a copy of the sources so the build leaves nothing in the checkout)."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    source.mkdir()
    shutil.copy(REPO_ROOT / "pyproject.toml", source)
    shutil.copy(README, source)
    shutil.copytree(
        REPO_ROOT / "sa_jobqueue",
        source / "sa_jobqueue",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    dist = root / "dist"
    _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(source)],
        root,
    )
    (wheel,) = dist.glob("sa_jobqueue-*.whl")
    env = Venv(root / "venv")
    # No pip of its own (ensurepip takes seconds): this pip installs into it, with the
    # dependencies, as it would into any environment (--python: pip run by the venv's Python).
    _run([sys.executable, "-m", "venv", "--without-pip", str(env.root)], root)
    _run(
        [sys.executable, "-m", "pip", "--python", str(env.bin / "python"), "install", "-q",
         str(wheel)],
        root,
    )  # fmt: skip
    assert env.our_versions.is_relative_to(env.root)
    return env


# -- the README's instructions -----------------------------------------------------------------


def readme_block(first_line: str) -> str:
    """The guide's fenced code block whose first line is ``first_line``."""
    blocks = re.findall(r"^```\w*\n(.*?)^```", GUIDE.read_text(), flags=re.S | re.M)
    found = [b for b in blocks if b.splitlines()[0].strip() == first_line]
    assert len(found) == 1, f"the guide should have one block starting {first_line!r}"
    return found[0]


def readme_ini_keys() -> dict[str, str]:
    """The ``[alembic]`` keys the README tells the user to set in their alembic.ini."""
    keys: dict[str, str] = {}
    for line in readme_block("# alembic.ini").splitlines():
        match = re.fullmatch(r"([\w.]+)\s*=\s*(.*)", line.strip())
        if match:
            keys[match[1]] = match[2]
    return keys


def readme_env_py() -> str:
    return readme_block("# migrations/env.py")


# -- the user's project ----------------------------------------------------------------------

MODELS_HEAD = '''\
"""myapp's models."""

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True)
    customer: Mapped[str] = mapped_column(sa.Text)
'''

#: Two later versions of the models, one per autogenerate.
MODELS_CUSTOMERS = (
    MODELS_HEAD
    + """

class Customer(Base):
    __tablename__ = "customers"

    id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True)
    name: Mapped[str] = mapped_column(sa.Text)
"""
)
MODELS_NOTES = MODELS_CUSTOMERS.replace(
    "    customer: Mapped[str] = mapped_column(sa.Text)\n",
    "    customer: Mapped[str] = mapped_column(sa.Text)\n"
    "    note: Mapped[str | None] = mapped_column(sa.Text)\n",
)

#: A revision the existing project wrote by hand before it used sa_jobqueue.
EXISTING_REVISION = '''\
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
        "orders",
        sa.Column("id", sa.BigInteger(), primary_key=True),
        sa.Column("customer", sa.Text(), nullable=False),
    )


def downgrade():
    op.drop_table("orders")
'''


@dataclass
class Generated:
    path: Path
    revision: str
    down_revision: str | None
    text: str


class Project:
    """A user's project in ``root``: myapp/ (models) and an Alembic environment."""

    def __init__(self, root: Path, venv: Venv, url: URL) -> None:
        self.root = root
        self.venv = venv
        self.url = url
        root.mkdir()
        (root / "myapp").mkdir()
        (root / "myapp" / "__init__.py").write_text("")
        self.models(MODELS_HEAD)

    @property
    def versions(self) -> Path:
        return self.root / "migrations" / "versions"

    def models(self, source: str) -> None:
        (self.root / "myapp" / "models.py").write_text(source)

    def alembic(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _run([str(self.venv.bin / "alembic"), *args], self.root, check=check)

    def init(self) -> None:
        """``alembic init migrations``, as a project starting out does."""
        self.alembic("init", "migrations")

    def set_ini(self, keys: dict[str, str]) -> None:
        """Set ``[alembic]`` keys in alembic.ini: replace the active line, or add one."""
        ini = self.root / "alembic.ini"
        text = ini.read_text()
        for key, value in keys.items():
            line = f"{key} = {value}"
            text, replaced = re.subn(
                rf"^{re.escape(key)}\s*=.*$", lambda _m, line=line: line, text, count=1, flags=re.M
            )
            if not replaced:
                text = text.replace("[alembic]\n", f"[alembic]\n{line}\n", 1)
        ini.write_text(text)

    def follow_readme(self) -> None:
        """Configure alembic.ini and env.py as the README says, with the test's database."""
        self.set_ini(readme_ini_keys())
        self.set_ini({"sqlalchemy.url": url_string(self.url).replace("%", "%%")})
        (self.root / "migrations" / "env.py").write_text(readme_env_py())

    def autogenerate(self, message: str) -> Generated:
        result = self.alembic("revision", "--autogenerate", "-m", message)
        return self._generated(result)

    def revision(self, message: str) -> Generated:
        """A plain ``alembic revision`` (no autogenerate)."""
        return self._generated(self.alembic("revision", "-m", message))

    def _generated(self, result: subprocess.CompletedProcess[str]) -> Generated:
        match = re.search(r"Generating (.+?\.py) \.\.\.\s+done", result.stdout)
        assert match, f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
        path = Path(match[1])
        text = path.read_text()
        # ``revision = 'x'``, or ``revision: str = 'x'`` as alembic init's template writes it.
        revision = re.search(r"^revision(?:: .+?)? = (.+)$", text, flags=re.M)
        down = re.search(r"^down_revision(?:: .+?)? = (.+)$", text, flags=re.M)
        assert revision, text
        assert down, text
        return Generated(path, ast.literal_eval(revision[1]), ast.literal_eval(down[1]), text)

    def heads(self) -> str:
        return self.alembic("heads").stdout


def creates_table(generated: Generated, table: str) -> bool:
    return re.search(rf"op\.create_table\(\s*['\"]{table}['\"]", generated.text) is not None


def our_files(venv: Venv) -> set[str]:
    return {p.name for p in venv.our_versions.iterdir() if p.suffix == ".py"}


def snapshot_ours(engine: sa.Engine) -> dict[str, object]:
    """sa_jobqueue's tables as the database has them: columns, indexes, constraints."""
    with engine.connect() as conn:
        inspector = sa.inspect(conn)
        return {
            table: (
                [(c["name"], str(c["type"]), c["nullable"]) for c in inspector.get_columns(table)],
                sorted(i["name"] or "" for i in inspector.get_indexes(table)),
                sorted(c["name"] or "" for c in inspector.get_check_constraints(table)),
            )
            for table in OUR_TABLES
        }


def app_versions(engine: sa.Engine) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars())


def assert_in_users_tree(project: Project, venv: Venv, generated: Generated) -> None:
    assert generated.path.parent.resolve() == project.versions.resolve(), generated.path
    assert not generated.path.resolve().is_relative_to(venv.root.resolve())
    # Nothing of ours in a user's revision: no drop, no alter, no create.
    assert "sa_jobqueue" not in generated.text, generated.text


def assert_finished(project: Project, venv: Venv, engine: sa.Engine, head: str) -> None:
    """Both histories applied, nothing left to generate, our package untouched."""
    project.alembic("upgrade", "heads")
    checked = project.alembic("check")
    assert "No new upgrade operations detected" in checked.stdout + checked.stderr
    assert app_versions(engine) == {SCHEMA_REVISION, head}
    heads = project.heads()
    assert f"{SCHEMA_REVISION} (sa_jobqueue) (head)" in heads
    assert f"{head} (head)" in heads
    assert our_files(venv) == {
        p.name for p in (REPO_ROOT / "sa_jobqueue/migrations/versions").glob("*.py")
    }
    check_schema(engine)


def test_starting_fresh(
    venv: Venv, tmp_path: Path, empty_database_url: URL, empty_engine: sa.Engine
) -> None:
    project = Project(tmp_path / "myproject", venv, empty_database_url)
    project.init()
    project.follow_readme()

    # The README's env.py in offline mode: SQL for our revisions, and nothing run.
    offline = project.alembic("upgrade", "heads", "--sql")
    assert "CREATE TABLE sa_jobqueue_jobs" in offline.stdout
    assert "INSERT INTO alembic_version (version_num) VALUES ('sajq_0001')" in offline.stdout

    project.alembic("upgrade", "heads")  # our tables first: autogenerate needs an up-to-date db
    ours = snapshot_ours(empty_engine)

    first = project.autogenerate("orders")
    assert_in_users_tree(project, venv, first)
    assert first.down_revision is None  # the first revision of the user's own branch
    assert creates_table(first, "orders")
    project.alembic("upgrade", "heads")

    project.models(MODELS_CUSTOMERS)
    second = project.autogenerate("customers")
    assert_in_users_tree(project, venv, second)
    assert second.down_revision == first.revision
    assert creates_table(second, "customers")

    assert_finished(project, venv, empty_engine, second.revision)
    assert snapshot_ours(empty_engine) == ours


def test_existing_history(
    venv: Venv, tmp_path: Path, empty_database_url: URL, empty_engine: sa.Engine
) -> None:
    project = Project(tmp_path / "myproject", venv, empty_database_url)
    project.init()
    # The project as it was before sa_jobqueue: its own history, applied.
    (project.versions / "app_0001_orders.py").write_text(EXISTING_REVISION)
    project.set_ini({"sqlalchemy.url": url_string(empty_database_url).replace("%", "%%")})
    project.alembic("upgrade", "head")
    assert app_versions(empty_engine) == {"app_0001"}

    # It adds sa_jobqueue as the README says, and installs our tables.
    project.follow_readme()
    project.alembic("upgrade", "heads")
    ours = snapshot_ours(empty_engine)

    project.models(MODELS_CUSTOMERS)
    first = project.autogenerate("customers")
    assert_in_users_tree(project, venv, first)
    assert first.down_revision == "app_0001"
    project.alembic("upgrade", "heads")

    project.models(MODELS_NOTES)
    second = project.autogenerate("order notes")
    assert_in_users_tree(project, venv, second)
    assert second.down_revision == first.revision
    assert "add_column" in second.text
    project.alembic("upgrade", "heads")

    # A hand-written revision (no autogenerate) follows the same rule.
    third = project.revision("backfill notes")
    assert_in_users_tree(project, venv, third)
    assert third.down_revision == second.revision

    # Asked to put a revision on our branch, the hook refuses in one line and writes nothing.
    for args in (["--head", "sa_jobqueue@head"], ["--version-path", str(venv.our_versions)]):
        refused = project.alembic("revision", "-m", "misplaced", *args, check=False)
        assert refused.returncode != 0
        assert "FAILED: " in refused.stdout
        assert "sa_jobqueue's" in refused.stdout
        assert "Traceback" not in refused.stderr

    assert_finished(project, venv, empty_engine, third.revision)
    assert snapshot_ours(empty_engine) == ours
