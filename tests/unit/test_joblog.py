"""The job log's records and formatter, without a database."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

import pytest

from sa_jobqueue.observability import JobRun
from sa_jobqueue.observability.logs import JOB_LOGGER, JsonFormatter, LoggingObserver

RUN = JobRun(id=7, task="ok", queue="default", attempt=2, max_attempts=5)


def job_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == JOB_LOGGER]


def field(record: logging.LogRecord, name: str) -> Any:
    """A field the observer gave in ``extra``; None if the record has none of that name."""
    return record.__dict__.get(name)


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
