"""Job logs: one record per transition, its fields as record attributes, and JSON lines."""

from __future__ import annotations

import json
import logging
import subprocess
from datetime import timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sa_jobqueue import Worker
from sa_jobqueue.observability.logs import JOB_LOGGER, LoggingObserver
from tests.apps.observed import queue
from tests.helpers.databases import url_string
from tests.helpers.processes import CLI, REPO_ROOT, run_cli, subprocess_env
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


@pytest.mark.slow
@pytest.mark.parametrize("log_format", ["text", "json"])
def test_the_worker_logs_an_errors_control_characters_visibly(
    engine: sa.Engine, database_url: URL, log_format: str
) -> None:
    message = "red\x1b[31m clear\x1b[2J bell\x07 del\x7f csi\x9b1m rtl\u202e cr\roverwritten"
    with Session(engine) as session:
        job_id = queue.enqueue(session, "echoes", {"message": message})
        session.commit()
    command = ["worker", "tests.apps.observed:queue", "--database-url", url_string(database_url)]
    command += ["--burst", "--log-level", "DEBUG", "--log-format", log_format]
    result = subprocess.run(
        [*CLI, *command],
        cwd=REPO_ROOT,
        env=subprocess_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,  # bytes: no newline translation hides a CR
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    err = result.stderr.decode()
    lines = [line for line in err.split("\n") if f"job {job_id} (echoes)" in line]
    assert any("dead" in line for line in lines), err
    controls = [
        c for c in err if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) <= 0x9F or c in "\u202e"
    ]
    assert controls == []
    shown = "\\x1b[31m" if log_format == "text" else "\\\\x1b[31m"  # JSON escapes the \\
    assert any(shown in line for line in lines), lines
