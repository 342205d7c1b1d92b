"""Trying the worker's own statements again through transient errors, with a backoff.

Every statement tried again here is fenced on ``(job id, attempt)``, so repeating it is safe:
a try whose commit reached the server before its answer was lost makes the next one match
nothing. What this does not promise: that a statement is ever written; after its window the
error is raised, and the job is left to its lease. Which errors are transient is
:func:`sa_jobqueue._binds.transient`'s to say (the enqueue side asks it too).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from .._binds import transient
from .._deadlines import StopClock
from .._error_text import one_line

log = logging.getLogger("sa_jobqueue.worker")

T = TypeVar("T")

#: A statement that failed is tried again after this long (seconds), the wait doubling up to
#: RETRY_CAP: a brief outage (a restart, "too many clients") costs no job a second run.
RETRY_FIRST = 0.05
RETRY_CAP = 1.0

#: How long an outcome whose statement failed on a transient error (a lost connection, a
#: refused one: "too many clients", a restart) is tried again before the worker gives up and
#: leaves the job to its lease (seconds). Within the default 30 s lease, so the retry is done
#: while the job is still this worker's; a try after a shorter lease ran out is fenced.
RECORD_RETRY = 10.0


def retrying(write: Callable[[], T], what: str, clock: StopClock | None = None) -> T:
    """Run ``write`` (one fenced statement, safe to repeat), again with backoff on a transient
    error for up to RECORD_RETRY seconds (less once a stopping worker must be gone, by
    ``clock``); then raise. It runs on the job's thread, which keeps its slot meanwhile: a
    worker that cannot write its outcomes claims no more jobs."""

    def first_failure(exc: Exception) -> None:
        log.warning("%s: %s; retrying for up to %g s", what, one_line(exc), RECORD_RETRY)

    return retry_with_backoff(write, RECORD_RETRY, transient, first_failure, clock)


def retry_with_backoff(
    write: Callable[[], T],
    window: float,
    retryable: Callable[[Exception], bool],
    on_first_failure: Callable[[Exception], None],
    clock: StopClock | None = None,
) -> T:
    """Run ``write`` (safe to repeat), again after a retryable error with a backoff from
    RETRY_FIRST doubling to RETRY_CAP, for up to ``window`` seconds (and no later than a
    stopping worker must be gone, by ``clock``); then raise.

    The window opens at the first failure, which may itself have taken a whole statement
    deadline (a connection gone silent): counted from the start, it could leave no retry.
    ``on_first_failure`` is told of that failure once, if it is retryable.
    """
    give_up: float | None = None
    delay = RETRY_FIRST
    while True:
        try:
            return write()
        except Exception as exc:
            if not retryable(exc):
                raise
            if give_up is None:
                give_up = time.monotonic() + window
                on_first_failure(exc)
            until = give_up if clock is None else min(give_up, clock.until)
            if time.monotonic() + delay > until:
                raise
        time.sleep(delay)  # backoff between tries, not synchronisation
        delay = min(delay * 2, RETRY_CAP)
