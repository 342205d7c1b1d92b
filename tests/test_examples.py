"""The examples are documentation, so they must run: each one against a test database."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL

from sa_jobqueue.models import Job
from tests.conftest import url_string

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(name: str, url: URL) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": url_string(url), "COLUMNS": "100"}
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def statuses(url: URL) -> dict[str, int]:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        rows = conn.execute(sa.select(Job.status, sa.func.count()).group_by(Job.status)).all()
    engine.dispose()
    return {status: n for status, n in rows}


def test_outbox_example_runs(database_url: URL) -> None:
    result = run_example("outbox.py", database_url)
    assert result.returncode == 0, result.stderr
    assert statuses(database_url) == {"succeeded": 1}


def test_signup_example_tests_pass(database_url: URL) -> None:
    # The example test file is run as a user would run it: pytest, in a process of its own,
    # with this repository's pytest settings (warnings are errors), against a fresh database.
    env = {**os.environ, "DATABASE_URL": url_string(database_url)}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_signup.py"],
        cwd=EXAMPLES,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 passed" in result.stdout
    assert statuses(database_url) == {}  # the committing test cleaned up after itself


@pytest.mark.slow
def test_demo_runs(database_url: URL) -> None:
    result = run_example("demo.py", database_url)
    assert result.returncode == 0, result.stderr
    counts = statuses(database_url)
    assert counts["dead"] == 1
    assert counts["succeeded"] > 5_000
