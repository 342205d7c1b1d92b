"""A worker app whose process cannot exit on its own: an ``atexit`` hook that never returns.

As a library of the application's may do (an exporter flushing to an endpoint that does not
answer): the worker stops cleanly, and the interpreter then waits in the hook for ever.
tests/acceptance/test_shutdown_and_cancel.py checks that the process exits all the same.
"""

from __future__ import annotations

import atexit
import threading
from typing import Any

from sa_jobqueue import JobContext, JobQueue

queue = JobQueue()


@queue.task
def noop(ctx: JobContext, payload: Any) -> None:
    pass


def flush_for_ever() -> None:
    """The hook: waits for an event nobody sets."""
    threading.Event().wait()


atexit.register(flush_for_ever)
