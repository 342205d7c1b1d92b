"""The tasks tests/acceptance/test_progress.py runs in real worker subprocesses.

Each reports progress, then blocks on a gate file the test creates once it has seen what it
waits for on the job's row (the handler's wait is a poll with a deadline, never a guess).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from sa_jobqueue import JobContext, JobQueue
from sa_jobqueue._progress import ProgressReport
from tests.apps import common

queue = JobQueue()

#: Longest a handler waits for its gate (seconds): far beyond what any test waits.
HANDLER_WAIT = 30.0


@queue.task(lease=timedelta(seconds=30))
def reports(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Report progress in a tight loop (the last report is what the row must show), wait for
    the gate, then report once more and return."""
    for i in range(1, 10_001):
        ctx.report_progress(i / 20_000, f"step {i} of 20000")
    common.wait_for_file(Path(payload["gate"]), HANDLER_WAIT)
    ctx.report_progress(1.0, "done")


@queue.task(lease=timedelta(seconds=2))
def reports_what_the_database_refuses(ctx: JobContext, payload: dict[str, Any]) -> None:
    """A report that passed no check (a NUL character, which PostgreSQL's text cannot hold),
    set as the call would, then a wait over several renewals of its 2 s lease."""
    ctx._progress = ProgressReport(0.5, "a\x00b")
    common.wait_for_file(Path(payload["gate"]), HANDLER_WAIT)


def in_child(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Run in a child process of its own (hard_timeout): its report crosses to the worker."""
    ctx.report_progress(0.3, "from the child")
    common.wait_for_file(Path(payload["gate"]), HANDLER_WAIT)


queue.task(name="in_child", hard_timeout=timedelta(seconds=60), lease=timedelta(seconds=90))(
    in_child
)
