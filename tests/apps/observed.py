"""Tasks for the metrics and logging tests: one that succeeds, one that always fails."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sa_jobqueue import Backoff, JobContext, JobQueue

queue = JobQueue()


@queue.task
def ok(ctx: JobContext, payload: Any) -> None:
    """Succeeds at once."""


@queue.task(max_attempts=2, backoff=Backoff(base=timedelta(milliseconds=10), jitter=0))
def fails(ctx: JobContext, payload: Any) -> None:
    """Fails every attempt: retried once, then dead."""
    raise ValueError("boom")


@queue.task(max_attempts=1)
def dies(ctx: JobContext, payload: Any) -> None:
    """Fails its only attempt: dead at once (a burst worker sees it through)."""
    raise ValueError("boom")


@queue.task(max_attempts=1)
def echoes(ctx: JobContext, payload: Any) -> None:
    """Fails its only attempt with the payload's ``message`` as the error's message."""
    raise ValueError(payload["message"])
