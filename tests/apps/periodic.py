"""A queue with periodic schedules, for tests that run real worker processes.

``yearly`` ticks at midnight on January 1st (UTC) only, so during a test every one of its jobs
comes from :func:`tests.helpers.periodic.rewind` making that tick due again; ``minutely`` ticks
every minute, for tests that can afford to wait for a real tick. Both handlers do nothing: the
jobs (``sa_jobqueue_jobs`` rows, their tick in the payload) are what the tests count.
"""

from __future__ import annotations

from typing import Any

from sa_jobqueue import JobContext, JobQueue
from tests.helpers.periodic import YEARLY

queue = JobQueue()


@queue.periodic(YEARLY, name="yearly")
@queue.task
def yearly_task(ctx: JobContext, payload: Any) -> None:
    pass


@queue.periodic("* * * * *", timezone="Europe/Paris", payload={"kind": "minutely"})
@queue.task
def minutely(ctx: JobContext, payload: Any) -> None:
    pass
