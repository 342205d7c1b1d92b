"""Workers of two versions around an upgrade: the order the upgrading how-to gives (migrate,
then roll the workers) works with real processes.

The previous version is this repository at the commit before our newest revision was added
(its schema one revision older), taken with ``git archive`` into a temporary directory; its
worker runs from there (``python -m sa_jobqueue`` in that directory imports that checkout
first) with this environment's dependencies. Skipped where the repository's history is not
at hand (a source tarball).
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL

from sa_jobqueue.database import create_engine
from sa_jobqueue.migrations import VERSION_TABLE, upgrade
from sa_jobqueue.models import SCHEMA_REVISION
from tests.helpers.processes import REPO_ROOT
from tests.helpers.waiting import wait_for
from tests.migrations.test_migrations import versions

pytestmark = pytest.mark.slow

#: The commit before the one that added our newest revision (sajq_0017, in the merge of the
#: workflow objects): the first parent of that merge, whose schema is at sajq_0016.
PREVIOUS = "3fa40be"
PREVIOUS_HEAD = "sajq_0016"

#: The previous version's worker application: one task whose effect row is committed with
#: the job's completion, in ``ctx.session`` (the exactly-once effect).
APP = """
from sa_jobqueue import JobContext, JobQueue

queue = JobQueue()


@queue.task
def effect(ctx: JobContext, payload: object) -> None:
    ctx.session.execute(
        __import__("sqlalchemy").text("INSERT INTO mixed_effects (job_id) VALUES (:id)"),
        {"id": ctx.job_id},
    )
"""

ENQUEUE = sa.text(
    "INSERT INTO sa_jobqueue_jobs (task, payload) SELECT 'effect', '{}' FROM generate_series(1, :n)"
)
SUCCEEDED = sa.text("SELECT count(*) FROM sa_jobqueue_jobs WHERE status = 'succeeded'")
EFFECTS = sa.text("SELECT count(*) AS effects, count(DISTINCT job_id) AS jobs FROM mixed_effects")


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous version's package and its worker application, in a directory."""
    found = subprocess.run(
        ["git", "cat-file", "-e", f"{PREVIOUS}^{{commit}}"], cwd=REPO_ROOT, capture_output=True
    )
    if found.returncode != 0:
        pytest.skip(f"commit {PREVIOUS} is not in this checkout's history")
    archive = subprocess.run(
        ["git", "archive", "--format=tar", PREVIOUS, "sa_jobqueue"],
        cwd=REPO_ROOT,
        capture_output=True,
        check=True,
    ).stdout
    root = tmp_path_factory.mktemp("previous")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(root, filter="data")
    (root / "mixed_app.py").write_text(APP)
    return root


@pytest.fixture
def old_schema(empty_database_url: URL) -> Iterator[sa.Engine]:
    engine = create_engine(empty_database_url, poolclass=sa.pool.NullPool)
    upgrade(engine, PREVIOUS_HEAD)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE mixed_effects (job_id bigint NOT NULL)"))
    yield engine
    engine.dispose()


def start_worker(cwd: Path, url: URL, log: Path, *app: str) -> subprocess.Popen[bytes]:
    """``python -m sa_jobqueue worker`` run in ``cwd``: that directory's package, if it has one."""
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DATABASE_URL")}
    with log.open("wb") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sa_jobqueue",
                "worker",
                *app,
                "--database-url",
                url.render_as_string(hide_password=False),
                "--concurrency",
                "2",
            ],
            cwd=cwd,
            env=environ,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def count(engine: sa.Engine, query: sa.TextClause) -> int:
    with engine.connect() as conn:
        return int(conn.execute(query).scalar_one())


def test_a_worker_of_the_previous_version_keeps_working_through_the_upgrade(
    previous: Path, old_schema: sa.Engine, empty_database_url: URL, tmp_path: Path
) -> None:
    """Jobs enqueued before and after the upgrade, all run by the previous version's worker,
    each exactly once; it then stops cleanly on SIGTERM."""
    with old_schema.begin() as conn:
        conn.execute(ENQUEUE, {"n": 300})
    log = tmp_path / "previous-worker.log"
    worker = start_worker(previous, empty_database_url, log, "mixed_app:queue")
    try:
        # It runs from the previous checkout: a worker of this version would refuse sajq_0016.
        wait_for(lambda: worker.poll() is not None or count(old_schema, SUCCEEDED) >= 50, 60)
        assert worker.poll() is None, log.read_text()

        upgrade(old_schema)  # while it works
        assert versions(old_schema, VERSION_TABLE) == [SCHEMA_REVISION]
        with old_schema.begin() as conn:
            conn.execute(ENQUEUE, {"n": 100})

        wait_for(lambda: worker.poll() is not None or count(old_schema, SUCCEEDED) == 400, 90)
        assert worker.poll() is None, log.read_text()
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0, log.read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    with old_schema.connect() as conn:
        effects = conn.execute(EFFECTS).one()
    assert (effects.effects, effects.jobs) == (400, 400)
    assert "Traceback" not in log.read_text()


def test_a_worker_of_this_version_refuses_the_previous_schema_in_one_line(
    old_schema: sa.Engine, empty_database_url: URL, tmp_path: Path
) -> None:
    """Started before the upgrade: exits 1, saying in one line which command to run."""
    log = tmp_path / "new-worker.log"
    worker = start_worker(REPO_ROOT, empty_database_url, log, "tests.apps.network:queue")
    try:
        assert worker.wait(60) == 1, log.read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("sa-jobqueue: "), lines
    assert "sa-jobqueue migrate" in lines[0], lines
    assert versions(old_schema, VERSION_TABLE) == [PREVIOUS_HEAD]
