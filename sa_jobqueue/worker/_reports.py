"""Telling the observers each attempt's outcome, once, after it is written."""

from __future__ import annotations

import threading

from ..observability import JobRun, Observers
from ._claimed import Claimed
from ._settlement import Outcome

_Key = tuple[int, int]  # (job id, attempt)


class Reports:
    """Tells the observers each attempt's outcome once, with its handler's run time.

    An attempt waits here from its handler's return until its outcome is recorded (a batched
    completion, a group's commit). A timeout the heartbeat records may come first: then the
    attempt was reported with it, and the handler's later return reports nothing.
    """

    def __init__(self, observe: Observers) -> None:
        self.observe = observe
        self._lock = threading.Lock()  # between a handler's return and its timeout
        self._settling: dict[_Key, tuple[JobRun, float | None]] = {}
        self._timed_out: set[_Key] = set()

    def ran(self, job: Claimed, run: JobRun, elapsed: float | None) -> None:
        """The handler returned or raised after ``elapsed`` seconds (None: it never ran)."""
        key = (job.id, job.attempts)
        with self._lock:
            if key in self._timed_out:
                self._timed_out.discard(key)  # its outcome was reported with its timeout
            else:
                self._settling[key] = (run, elapsed)

    def report(
        self, job_id: int, attempt: int, outcome: Outcome, error: BaseException | None = None
    ) -> None:
        """Tell the observers an attempt's outcome (once: later reports find nothing)."""
        if self.observe:
            entry = self._settling.pop((job_id, attempt), None)
            if entry is not None:
                self.observe.finished(entry[0], outcome.value, entry[1], error)

    def timed_out(
        self, run: JobRun, outcome: Outcome, timeout: float, error: BaseException
    ) -> None:
        """The heartbeat recorded the attempt's timeout: report it now, with the timeout."""
        key = (run.id, run.attempt)
        with self._lock:  # the handler may have returned meanwhile (see ran)
            if self._settling.pop(key, None) is None:
                self._timed_out.add(key)
        self.observe.finished(run, outcome.value, timeout, error)

    def completed(self, done: list[_Key]) -> None:
        """Batched completions recorded."""
        for job_id, attempt in done:
            self.report(job_id, attempt, Outcome.SUCCEEDED)

    def unrecorded(self, lost: list[_Key]) -> None:
        """Batched completions that could not be recorded."""
        for job_id, attempt in lost:
            self.report(job_id, attempt, Outcome.LOST)
