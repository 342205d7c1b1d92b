"""Tasks for the tests of unique keys on waiting jobs, run by worker subprocesses
(``tests.apps.unique_waiting:queue``). ``quick`` writes nothing through ``ctx.session``, so a
worker completes such jobs in batches: one statement ends many of them together."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sa_jobqueue import JobContext, JobQueue

queue = JobQueue(default_queue="uniq")


@queue.task(lease=timedelta(seconds=2))
def quick(ctx: JobContext, payload: Any) -> None:
    pass
