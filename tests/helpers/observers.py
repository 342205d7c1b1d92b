"""Observers that tests read: what each job's attempts ended as."""

from __future__ import annotations

from sa_jobqueue.observability import JobRun, Observer


class Outcomes(Observer):
    """Collects ``(job id, outcome)`` in the order observers are told them."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, str]] = []

    def finished(
        self, job: JobRun, outcome: str, run_time: float | None, error: BaseException | None
    ) -> None:
        self.seen.append((job.id, outcome))  # list.append is atomic: job threads may report
