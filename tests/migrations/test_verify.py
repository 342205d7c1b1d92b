"""``sa-jobqueue verify``: the hammer test a user runs against their own database.

The full run is the real command in a subprocess (it starts real worker subprocesses, SIGKILLs
one and cleans up); the verdict's arithmetic and the refusals are checked in-process on a
schema set up the way verify sets it up.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from datetime import timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy import insert, update
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sa_jobqueue._sql.verify import results, runs
from sa_jobqueue.database import create_engine
from sa_jobqueue.models import jobs_table
from sa_jobqueue.verify import hammer as verify
from sa_jobqueue.verify.report import RunEvents, Settings, measure
from tests.helpers.databases import url_string
from tests.helpers.processes import run_cli
from tests.helpers.waiting import wait_for

j = jobs_table.c


def verify_schemas(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                sa.text("SELECT nspname FROM pg_namespace WHERE nspname LIKE :prefix"),
                {"prefix": verify.SCHEMA_PREFIX + "%"},
            ).scalars()
        )


def other_backends(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND pid <> pg_backend_pid()"
                )
            ).scalar_one()
        )


@pytest.mark.slow
def test_verify_kills_a_worker_and_finds_nothing_lost_or_doubled(
    database_url: URL, engine: sa.Engine
) -> None:
    done = run_cli(
        "verify",
        "--jobs",
        "300",
        "--workers",
        "3",
        "--json",
        "--database-url",
        url_string(database_url),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)

    assert report["ok"] is True
    assert report["jobs"] == 300
    assert report["workers"] == 3
    assert report["statuses"] == {"succeeded": 300}
    assert report["succeeded"] == 300
    assert report["lost"] == 0
    assert report["duplicates"] == 0
    assert report["successes_without_result"] == 0
    assert report["results_without_success"] == 0
    # One worker was SIGKILLed a third of the way through and another took its place.
    assert isinstance(report["killed_worker"], int)
    assert isinstance(report["replacement_worker"], int)
    assert report["killed_worker"] != report["replacement_worker"]
    assert report["killed_after_succeeded"] >= 100
    assert report["timed_out"] is False
    assert report["unexpected_exits"] == []
    # At-least-once: never fewer executions than jobs; the surplus is the reruns.
    assert report["executions"] >= 300
    assert report["jobs_run_more_than_once"] <= report["executions"] - 300
    assert report["of_which_ran_on_killed_worker"] <= report["jobs_run_more_than_once"]
    assert report["throughput_jobs_per_second"] > 0
    latency = report["latency_ms"]
    assert 0 <= latency["p50"] <= latency["p95"] <= latency["p99"] <= latency["max"]

    # Cleaned up: the schema is gone, every worker has exited, and the database's own queue
    # (installed in public by the fixture) was never touched.
    assert report["schema_dropped"] is True
    assert verify_schemas(engine) == []
    wait_for(lambda: other_backends(engine) == 0, timeout=10)
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(jobs_table)).scalar() == 0


def test_usage_and_connection_errors_exit_2(empty_database_url: URL) -> None:
    bad = run_cli("verify", "--jobs", "0", "--database-url", url_string(empty_database_url))
    assert bad.returncode == 2
    assert "--jobs" in bad.stderr
    nowhere = "postgresql://nobody@127.0.0.1:1/nothing"
    unreachable = run_cli("verify", "--database-url", nowhere)
    assert unreachable.returncode == 2
    assert unreachable.stderr.startswith("sa-jobqueue: cannot connect")
    assert len(unreachable.stderr.strip().splitlines()) == 1


def test_the_verify_tasks_refuse_to_run_outside_verify(database_url: URL) -> None:
    done = run_cli(
        "worker", verify.WORKER_APP, "--burst", "--database-url", url_string(database_url)
    )
    assert done.returncode == 1
    assert verify.SCHEMA_ENV in done.stderr


# -- in-process: the verdict and the refusals -------------------------------------------------


@pytest.fixture
def schema_engine(database_url: URL) -> Iterator[tuple[str, sa.Engine]]:
    """A verify schema installed as verify installs it, dropped afterwards."""
    schema = verify.SCHEMA_PREFIX + secrets.token_hex(6)
    admin = create_engine(database_url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    with admin.connect() as conn:
        conn.execute(sa.schema.CreateSchema(schema))
    engine = verify._schema_engine(verify._schema_url(database_url, schema))
    try:
        verify._install(engine, schema)
        yield schema, engine
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.execute(sa.schema.DropSchema(schema, cascade=True))
        admin.dispose()


def test_measure_fails_on_a_duplicate_write_and_on_lost_jobs(
    schema_engine: tuple[str, sa.Engine],
) -> None:
    schema, engine = schema_engine
    with Session(engine) as session, session.begin():
        ids = verify._enqueuer.enqueue_many(session, verify.TASK, [{}] * 4)
    ok, doubled, dead, _queued = ids
    with engine.begin() as conn:
        conn.execute(
            update(jobs_table)
            .where(j.id.in_([ok, doubled]))
            .values(
                status="succeeded", attempts=1, started_at=sa.func.now(), finished_at=sa.func.now()
            )
        )
        conn.execute(
            update(jobs_table)
            .where(j.id == dead)
            .values(status="dead", attempts=5, finished_at=sa.func.now())
        )
        for job_id, attempt in ((ok, 1), (doubled, 1), (doubled, 2), (dead, 1)):
            started = conn.execute(
                insert(runs)
                .values(job_id=job_id, attempt=attempt, pid=1)
                .returning(runs.c.started_at)
            ).scalar_one()
            if job_id != dead:
                conn.execute(
                    insert(results).values(
                        job_id=job_id, attempt=attempt, pid=1, started_at=started
                    )
                )

    settings = Settings(jobs=4, workers=1, lease=timedelta(seconds=3))
    with engine.connect() as conn:
        report = measure(conn, settings, schema, RunEvents(killed_worker=1))

    assert not report.ok
    assert report.statuses == {"succeeded": 2, "dead": 1, "queued": 1}
    assert report.lost == 2
    assert report.duplicates == 1
    assert report.successes_without_result == 0
    assert report.results_without_success == 0
    assert report.executions == 4
    assert report.jobs_run_more_than_once == 1
    assert report.of_which_ran_on_killed_worker == 1
    text = report.as_text()
    assert "FAIL" in text
    assert "2 (1 dead, 1 queued)" in text


def test_install_refuses_connections_that_miss_the_schema(
    database_url: URL, schema_engine: tuple[str, sa.Engine]
) -> None:
    schema, _ = schema_engine
    # As behind a pooler that drops the search_path startup option: connections land in public.
    plain = create_engine(database_url, poolclass=sa.NullPool)
    try:
        with pytest.raises(verify.SetupError, match="search_path"):
            verify._install(plain, schema)
    finally:
        plain.dispose()
