"""Job logs: one record per transition, its fields as record attributes, and JSON lines."""

from __future__ import annotations

import json
import logging
from datetime import timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sa_jobqueue import Worker
from sa_jobqueue.observability.logs import JOB_LOGGER, LoggingObserver
from tests.apps.observed import queue
from tests.helpers.databases import url_string
from tests.helpers.processes import run_cli
from tests.helpers.waiting import running, wait_for
from tests.unit.test_joblog import field, job_records


def test_a_worker_logs_each_transition_with_the_jobs_fields(
    engine: sa.Engine, caplog: pytest.LogCaptureFixture
) -> None:
    with Session(engine) as session:
        good = queue.enqueue(session, "ok")
        bad = queue.enqueue(session, "fails")
        session.commit()
    caplog.set_level(logging.DEBUG, logger=JOB_LOGGER)
    worker = Worker(
        queue,
        engine,
        concurrency=2,
        poll_interval=timedelta(seconds=0.05),
        retention=None,
        observers=[LoggingObserver()],
    )
    with running(worker):  # not burst: the retry comes due after the first round
        wait_for(lambda: any(field(r, "outcome") == "dead" for r in job_records(caplog)))

    records = job_records(caplog)
    seen = [tuple(field(r, f) for f in ("job_id", "attempt", "event", "outcome")) for r in records]
    assert sorted(seen, key=str) == sorted(
        [
            (good, 1, "started", None),
            (good, 1, "finished", "succeeded"),
            (bad, 1, "started", None),
            (bad, 1, "finished", "retried"),
            (bad, 2, "started", None),
            (bad, 2, "finished", "dead"),
        ],
        key=str,
    )
    by_outcome = {field(r, "outcome"): r for r in records if field(r, "event") == "finished"}
    succeeded, retried, dead = by_outcome["succeeded"], by_outcome["retried"], by_outcome["dead"]
    assert (succeeded.levelno, retried.levelno, dead.levelno) == (
        logging.DEBUG,
        logging.WARNING,
        logging.ERROR,
    )
    assert field(succeeded, "task") == "ok"
    assert field(succeeded, "queue") == "default"
    assert field(succeeded, "max_attempts") == 5
    assert isinstance(field(succeeded, "duration"), float)
    assert field(succeeded, "duration") >= 0
    assert "error_type" not in succeeded.__dict__
    assert (field(dead, "error_type"), field(dead, "error")) == ("ValueError", "boom")
    assert field(dead, "max_attempts") == 2


@pytest.mark.slow
@pytest.mark.parametrize("before", [True, False], ids=["before-command", "after-command"])
def test_the_cli_worker_logs_json_lines(engine: sa.Engine, database_url: URL, before: bool) -> None:
    with Session(engine) as session:
        bad = queue.enqueue(session, "dies")
        session.commit()
    option = ["--log-format", "json"]
    command = ["worker", "tests.apps.observed:queue", "--database-url", url_string(database_url)]
    command.append("--burst")
    result = run_cli(*(option + command if before else command + option))
    assert result.returncode == 0, result.stderr
    entries = [json.loads(line) for line in result.stderr.splitlines()]  # every line is JSON
    assert any(e["logger"] == "sa_jobqueue.worker" for e in entries)
    dead = [e for e in entries if e["logger"] == JOB_LOGGER and e.get("outcome") == "dead"]
    assert len(dead) == 1
    assert dead[0]["job_id"] == bad
    assert dead[0]["level"] == "ERROR"
    assert (dead[0]["attempt"], dead[0]["error_type"]) == (1, "ValueError")
