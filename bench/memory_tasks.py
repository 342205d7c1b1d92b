"""The tasks of bench/memory.py: a no-op, so the worker's own memory is all there is to see,
and a job that writes one row through its session, the exactly-once path."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

from sa_jobqueue import JobContext, JobQueue

queue = JobQueue(default_queue="memory")


@queue.task
def noop(ctx: JobContext, payload: dict[str, Any]) -> None:
    pass


@queue.task
def write(ctx: JobContext, payload: dict[str, Any]) -> None:
    ctx.session.execute(text("INSERT INTO memory_results (n) VALUES (:n)"), payload)
