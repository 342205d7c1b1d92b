"""Job logs: one record per transition, its fields as record attributes, and JSON lines."""

from __future__ import annotations

import json
import logging
import sys
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sa_jobqueue import Worker
from sa_jobqueue.observability import JobRun
from sa_jobqueue.observability.logs import JOB_LOGGER, JsonFormatter, LoggingObserver
from tests.apps.observed import queue
from tests.conftest import url_string
from tests.support import running, wait_for
from tests.workers import run_cli

RUN = JobRun(id=7, task="ok", queue="default", attempt=2, max_attempts=5)


def job_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == JOB_LOGGER]


def field(record: logging.LogRecord, name: str) -> Any:
    """A field the observer gave in ``extra``; None if the record has none of that name."""
    return record.__dict__.get(name)


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


def test_success_and_start_records_are_debug_unless_asked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=JOB_LOGGER)
    quiet = LoggingObserver()
    quiet.started(RUN)
    quiet.finished(RUN, "succeeded", 0.5, None)
    quiet.finished(RUN, "cancelled", 0.5, None)
    quiet.lease_lost(RUN)
    assert [(r.levelno, field(r, "event")) for r in job_records(caplog)] == [
        (logging.INFO, "finished"),
        (logging.WARNING, "lease_lost"),
    ]
    caplog.clear()
    LoggingObserver(succeeded_level=logging.INFO).finished(RUN, "succeeded", 0.5, None)
    [record] = job_records(caplog)
    assert (record.levelno, field(record, "outcome")) == (logging.INFO, "succeeded")


def test_a_job_that_never_ran_has_no_duration(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=JOB_LOGGER)
    LoggingObserver().finished(RUN, "dead", None, LookupError("no task named 'gone'"))
    [record] = job_records(caplog)
    assert field(record, "duration") is None
    assert field(record, "error_type") == "LookupError"


def test_the_json_formatter_writes_one_object_with_the_extra_fields() -> None:
    logger = logging.getLogger("tests.joblog.json")
    try:
        raise RuntimeError("kaput")
    except RuntimeError:
        exc_info = sys.exc_info()
    record = logger.makeRecord(
        logger.name,
        logging.WARNING,
        __file__,
        1,
        "job %d: %s",
        (3, "ünïcode\nline"),
        exc_info,
        extra={"job_id": 3, "task": "ok", "when": object(), "level": "not the level"},
    )
    line = JsonFormatter().format(record)
    assert "\n" not in line  # one record, one line
    entry = json.loads(line)
    assert entry["level"] == "WARNING"  # an extra field cannot overwrite the record's own
    assert entry["logger"] == "tests.joblog.json"
    assert entry["message"] == "job 3: ünïcode\nline"
    assert entry["timestamp"].endswith("+00:00")
    assert (entry["job_id"], entry["task"]) == (3, "ok")
    assert entry["when"].startswith("<object object")  # not JSON: written as its str()
    assert "RuntimeError: kaput" in entry["exception"]
    assert not {"args", "msg", "levelno", "exc_info", "created"} & set(entry)


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
