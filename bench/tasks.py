"""sa_jobqueue's benchmark tasks: ``python -m sa_jobqueue worker bench.tasks:queue``."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import text

from bench.record import record
from sa_jobqueue import JobContext, JobQueue

queue = JobQueue(default_queue="bench")


@queue.task
def noop(ctx: JobContext, payload: dict[str, Any]) -> None:
    record(payload["n"])


@queue.task
def write(ctx: JobContext, payload: dict[str, Any]) -> None:
    record(payload["n"])
    # Through the job's session: commits with the job's completion, exactly once.
    ctx.session.execute(text("INSERT INTO bench_results (n) VALUES (:n)"), {"n": payload["n"]})


@queue.task
def sleep(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Waits ``payload["ms"]`` milliseconds, as a job calling a remote service would."""
    record(payload["n"])
    time.sleep(payload["ms"] / 1000)


@queue.task
def sleep_1ms(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Waits a millisecond, blocking its thread: the twin of ``bench.async_tasks``'s."""
    record(payload["n"])
    time.sleep(0.001)
