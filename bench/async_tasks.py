"""The ``async def`` twins of ``bench.tasks``'s handlers: ``sa-jobqueue worker
bench.async_tasks:queue``.

A queue of its own: a queue with an async handler runs an event loop beside its threads,
and a lane's claim buffer doubles (room for each kind), so ``bench.tasks`` stays sync-only
and its drains measure the same worker as before.
"""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import text

from bench.record import record
from sa_jobqueue import JobContext, JobQueue

queue = JobQueue(default_queue="bench")


@queue.task
async def noop_async(ctx: JobContext, payload: dict[str, Any]) -> None:
    record(payload["n"])


@queue.task
async def write_async(ctx: JobContext, payload: dict[str, Any]) -> None:
    record(payload["n"])
    # Through the job's async session: commits with the job's completion, exactly once.
    await ctx.async_session.execute(
        text("INSERT INTO bench_results (n) VALUES (:n)"), {"n": payload["n"]}
    )


@queue.task
async def sleep_1ms_async(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Waits a millisecond, letting the other handlers run meanwhile."""
    record(payload["n"])
    await asyncio.sleep(0.001)
