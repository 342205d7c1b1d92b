"""Tasks of the workflow benchmark: ``python -m sa_jobqueue worker bench.workflow_tasks:queue``."""

from __future__ import annotations

from typing import Any

from sa_jobqueue import JobContext, JobQueue

queue = JobQueue(default_queue="chord")


@queue.task(keep_result=True)
def member(ctx: JobContext, payload: dict[str, Any]) -> int:
    return int(payload["n"])


@queue.task(keep_result=True)
def gather(ctx: JobContext, payload: dict[str, Any]) -> int:
    return sum(ctx.upstream_results().values())
