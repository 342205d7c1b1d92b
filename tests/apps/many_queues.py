"""A task that does nothing, for workers that serve thousands of queues (its jobs go anywhere)."""

from __future__ import annotations

from typing import Any

from sa_jobqueue import JobContext, JobQueue

queue = JobQueue(default_queue="tenant-00000")


@queue.task
def touch(ctx: JobContext, payload: Any) -> None:
    """Nothing: what is measured is the claim, not the work."""
