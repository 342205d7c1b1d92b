"""Waiting for a condition without a fixed sleep, and running a worker in a thread."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from sa_jobqueue import Worker

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 10.0,
    interval: float = 0.02,
    context: Callable[[], str] | None = None,
) -> T:
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout``,
    with what ``context`` then says (a worker's log, say)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            said = f"\n{context()}" if context is not None else ""
            raise AssertionError(f"condition not met within {timeout}s: {predicate}{said}")
        time.sleep(interval)


@contextlib.contextmanager
def running(worker: Worker) -> Iterator[Worker]:
    """Run ``worker`` in a thread for the ``with`` block; then stop it and join its thread."""
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(30)
