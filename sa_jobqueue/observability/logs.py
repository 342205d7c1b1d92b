"""Structured job logs: one record per transition of an attempt, and a JSON formatter.

:class:`LoggingObserver` logs through the ``sa_jobqueue.jobs`` logger, with the job's
fields as record attributes (``extra``), so any handler or formatter can use them:

========================  =====================================================================
``event``                 ``started``, ``finished`` or ``lease_lost``
``job_id``                the job's id
``task``, ``queue``       its task and queue
``attempt``               the attempt's number (1 for the first), and ``max_attempts``
``outcome``               on ``finished``: succeeded, retried, dead, cancelled, lost, handed_back
``duration``              on ``finished``: the handler's run time in seconds (None if it never ran)
``error_type``            on ``finished`` after a failure: the exception's class name
``error``                 ... and the first line of its message
========================  =====================================================================

Levels: ``started`` DEBUG; ``succeeded`` DEBUG (``succeeded_level`` changes it); cancelled and
handed_back INFO; retried, lost and lease_lost WARNING; dead ERROR. Successes stay at DEBUG
by default because of their number: a worker drains tens of thousands of short jobs a second,
and formatting and writing a record (about 30 µs with :class:`JsonFormatter`) is a large share
of what such a job costs. A record below the logger's level costs one level check. The
traceback of a failure is not logged: it is in the job's ``last_error`` (``sa-jobqueue jobs
show ID``).

:class:`JsonFormatter` writes one JSON object per line: ``timestamp`` (UTC, ISO 8601),
``level``, ``logger``, ``message``, then every ``extra`` field of the record, and
``exception`` when the record carries one. ``sa-jobqueue --log-format json`` uses it.
:class:`TextFormatter` is the text lines' formatter.

Neither writes a control character as it is: a job's error can carry ESC sequences, carriage
returns or bidirectional overrides, which a terminal or a log viewer would obey. The text
formatter writes them out (``\x1b[31m``) and keeps each record's message on one line; the JSON
formatter escapes those JSON leaves as they are (``\u007f``), which reads back the same.
The ``error`` field is the message's first line with its control characters written out.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any, Final

from .._error_text import one_line
from .._visible import json_visible, visible
from ._observer import JobRun, Observer

#: The logger of the job records.
JOB_LOGGER: Final = "sa_jobqueue.jobs"

#: Each outcome's level (``succeeded`` is the observer's ``succeeded_level``).
OUTCOME_LEVELS: Final = {
    "retried": logging.WARNING,
    "dead": logging.ERROR,
    "cancelled": logging.INFO,
    "lost": logging.WARNING,
    "handed_back": logging.INFO,
}


class LoggingObserver(Observer):
    """Logs one record per transition of each attempt to ``sa_jobqueue.jobs`` (see module).

    ``succeeded_level``: the level of the most frequent record, a success (default DEBUG).
    What it does not promise: a ``finished`` record for an attempt whose worker is killed.
    """

    def __init__(
        self, logger: logging.Logger | None = None, *, succeeded_level: int = logging.DEBUG
    ) -> None:
        self.logger = logger if logger is not None else logging.getLogger(JOB_LOGGER)
        self.levels = {**OUTCOME_LEVELS, "succeeded": succeeded_level}

    def started(self, job: JobRun) -> None:
        if self.logger.isEnabledFor(logging.DEBUG):
            self.logger.debug(
                "job %d (%s) attempt %d/%d started",
                job.id,
                visible(job.task, lines=False),
                job.attempt,
                job.max_attempts,
                extra=_fields(job, "started"),
            )

    def finished(
        self, job: JobRun, outcome: str, run_time: float | None, error: BaseException | None
    ) -> None:
        level = self.levels.get(outcome, logging.WARNING)
        if not self.logger.isEnabledFor(level):
            return
        fields = _fields(job, "finished")
        fields["outcome"] = outcome
        fields["duration"] = None if run_time is None else round(run_time, 6)
        if error is not None:
            fields["error_type"] = visible(type(error).__name__, lines=False)
            fields["error"] = _message(error)
        self.logger.log(
            level,
            "job %d (%s) attempt %d/%d %s%s%s",
            job.id,
            visible(job.task, lines=False),
            job.attempt,
            job.max_attempts,
            outcome,
            "" if run_time is None else f" after {run_time:.3f}s",
            "" if error is None else f": {fields['error_type']}: {fields['error']}",
            extra=fields,
        )

    def lease_lost(self, job: JobRun) -> None:
        if self.logger.isEnabledFor(logging.WARNING):
            self.logger.warning(
                "job %d (%s) attempt %d lost its lease while running",
                job.id,
                visible(job.task, lines=False),
                job.attempt,
                extra=_fields(job, "lease_lost"),
            )


def _fields(job: JobRun, event: str) -> dict[str, Any]:
    return {
        "event": event,
        "job_id": job.id,
        "task": job.task,
        "queue": job.queue,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
    }


def _message(error: BaseException) -> str:
    try:
        return one_line(error)
    except Exception:  # a broken __str__ must not cost the record
        return "<unprintable>"


#: Attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD: Final = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "taskName",
}


class TextFormatter(logging.Formatter):
    """``logging.Formatter`` whose lines show control characters rather than obey them.

    The message (and the line it is on) keeps to one line: a line feed in it is written
    ``\x0a``, so no message can pass for another record. A traceback keeps its lines.
    """

    def formatMessage(self, record: logging.LogRecord) -> str:
        return visible(super().formatMessage(record), lines=False)

    def formatException(self, ei: Any) -> str:
        return visible(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return visible(super().formatStack(stack_info))


class JsonFormatter(logging.Formatter):
    """Formats a record as one line of JSON: timestamp, level, logger, message, extra fields.

    Values JSON cannot hold are written as their ``str()``. A field of ``extra`` named like
    one of the four first keys is dropped rather than allowed to overwrite it.
    """

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json_visible(json.dumps(entry, default=str, ensure_ascii=False))
