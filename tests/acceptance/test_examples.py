"""The examples are documentation, so they must run: each one against a test database."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL

from sa_jobqueue.models import Job
from tests.helpers.databases import url_string
from tests.helpers.jobs import statuses
from tests.helpers.processes import REPO_ROOT

EXAMPLES = REPO_ROOT / "examples"


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


def test_outbox_example_runs(database_url: URL, engine: sa.Engine) -> None:
    result = run_example("outbox.py", database_url)
    assert result.returncode == 0, result.stderr
    assert statuses(engine) == {"succeeded": 1}


def test_signup_example_tests_pass(database_url: URL, engine: sa.Engine) -> None:
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
    assert statuses(engine) == {}  # the committing test cleaned up after itself


# -- the demo never touches data it did not create ----------------------------------------------


def snapshot(url: URL) -> dict[str, object]:
    """Everything of the user's that the demo must leave alone: rows, tables and schemas."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        found = {
            "jobs": conn.execute(sa.select(Job).order_by(Job.id)).all(),
            "customers": conn.execute(sa.text("SELECT * FROM customers ORDER BY id")).all(),
            "schemas": conn.execute(
                sa.text("SELECT nspname FROM pg_namespace ORDER BY nspname")
            ).all(),
            "tables": conn.execute(
                sa.text(
                    "SELECT schemaname, tablename FROM pg_tables"
                    " WHERE schemaname NOT IN ('pg_catalog', 'information_schema') ORDER BY 1, 2"
                )
            ).all(),
            "next_job_id": conn.execute(
                sa.text("SELECT last_value FROM sa_jobqueue_jobs_id_seq")
            ).scalar_one(),
        }
    engine.dispose()
    return found


def users_data(url: URL) -> None:
    """A queued job of the user's in sa_jobqueue_jobs, and a row in a table of their own."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL)"))
        conn.execute(sa.text("INSERT INTO customers VALUES (1, 'Grace')"))
        conn.execute(
            sa.insert(Job).values(task="send_invoice", payload={"invoice": 7}, queue="default")
        )
    engine.dispose()


@pytest.mark.slow
def test_demo_given_a_database_works_in_a_schema_of_its_own(database_url: URL) -> None:
    users_data(database_url)
    before = snapshot(database_url)
    url = url_string(database_url)
    # The ambient DATABASE_URL points at the same database: only the flag may be used, and
    # even then the demo may not touch the user's rows.
    env = {**os.environ, "DATABASE_URL": url, "COLUMNS": "100"}
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "demo.py"), "--database-url", url],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    after = snapshot(database_url)
    assert after["jobs"] == before["jobs"]
    (job,) = after["jobs"]  # type: ignore[misc]
    assert (job.status, job.payload) == ("queued", {"invoice": 7})
    assert after == before
    # The tour itself ran: the drain, the effect rows matching the jobs, the dead letter.
    assert "5,000 jobs in" in result.stdout
    assert "5,000 rows for 5,000 jobs ✓" in result.stdout
    assert "dead job #" in result.stdout
    assert "dropped schema sajq_demo_" in result.stdout


@pytest.mark.slow
def test_demo_ignores_the_ambient_database_url(database_url: URL) -> None:
    # The README's Quickstart has users export DATABASE_URL for their application; the demo
    # must not take it as leave to work there. Without --database-url it starts the embedded
    # server (pgserver), so the user's database sees nothing at all.
    users_data(database_url)
    before = snapshot(database_url)
    result = run_example("demo.py", database_url)
    assert result.returncode == 0, result.stdout + result.stderr
    assert snapshot(database_url) == before
    assert "embedded PostgreSQL" in result.stdout
