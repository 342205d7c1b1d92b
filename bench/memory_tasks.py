"""The task of bench/memory.py: a no-op, so the worker's own memory is all there is to see."""

from __future__ import annotations

from typing import Any

from sa_jobqueue import JobContext, JobQueue

queue = JobQueue(default_queue="memory")


@queue.task
def noop(ctx: JobContext, payload: dict[str, Any]) -> None:
    pass
