"""The reference model: what the checker committed, and so what must be true of the jobs.

The runner writes here what every call returned, with the database's clock read right after
its commit: the jobs each enqueue created (their task, payload and options, their edges and
unique keys), what each cancel and requeue did, and each queue's settings over time. The
invariants read the model beside what the database says, and the two must agree.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass
class JobRecord:
    """A job the checker's committed enqueue created."""

    id: int
    step: int
    task: str
    payload: dict[str, Any]
    queue: str
    unique_key: str | None
    #: (dependency id, on_failure) of each edge the job was enqueued with.
    deps: list[tuple[int, str]] = field(default_factory=list)
    cancelled_by_checker: bool = False
    requeued: int = 0
    #: Deleted by a bulk delete the checker committed (it was finished then): gone for good.
    deleted: bool = False
    #: A typed job whose stored payload was made not to fit its type before it committed.
    misfit: bool = False
    #: Enqueued through an Engine (a transaction of the enqueue's own, retried).
    engine: bool = False


@dataclass
class Change:
    """One change of a queue's settings, committed before ``at`` (database clock)."""

    step: int
    queue: str
    what: str  # "pause", "resume", "cap", "key_cap", "rate", "key_rate", "clear"
    value: Any
    at: datetime
    #: The clock read before its transaction began (None: not read): it committed between.
    before: datetime | None = None


@dataclass
class Model:
    """Everything the checker did and saw, step by step."""

    jobs: dict[int, JobRecord] = field(default_factory=dict)
    #: Each id an enqueue returned that was not a job it created (a key held), and by whom.
    returned: list[tuple[int, int, str, str | None]] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    #: (step, what happened) for every step, operations and faults alike.
    log: list[tuple[int, str]] = field(default_factory=list)
    #: Violations found while running (an operation's own check), as the invariants give them.
    found: list[Violation] = field(default_factory=list)
    #: (pid, SIGSTOP at, SIGCONT at or None), database clock.
    stops: list[tuple[int, datetime, datetime | None]] = field(default_factory=list)
    #: How much some checks looked at (windows of a rate, ...), for the report's notes.
    checked: dict[str, int] = field(default_factory=dict)
    #: Whether a blackhole fault ran: a handler waiting on a silent connection may outlast a
    #: worker's shutdown grace, and the worker then exits 1 (as documented), not 0.
    silenced: bool = False
    #: The workers the checker told to stop (SIGTERM): they may hand back a started attempt.
    termed: set[int] = field(default_factory=set)
    #: The most running jobs with live leases one worker may hold (``worker_bound``).
    most_held: int = 0
    #: A worker's job threads (``--concurrency``): each may hold a batch of a batch task.
    threads: int = 0
    #: Every enqueue through an Engine: (step, task, payloads, whether it raised a transient
    #: error after its tries, the ids it returned). One that raised may have committed (its
    #: COMMIT's reply lost) or not.
    engine_calls: list[tuple[int, str, list[dict[str, Any]], bool, list[int]]] = field(
        default_factory=list
    )
    #: The clients write from several threads: jobs are added under this lock.
    lock: threading.Lock = field(default_factory=threading.Lock)

    def created(self, record: JobRecord) -> None:
        with self.lock:
            self.jobs[record.id] = record

    def has(self, job_id: int) -> bool:
        with self.lock:
            return job_id in self.jobs

    def order(self) -> list[int]:
        """Job ids in the order they were recorded."""
        with self.lock:
            return list(self.jobs)

    def cap_since(self, queue: str, what: str) -> tuple[int | None, datetime | None]:
        """The queue's current cap of kind ``what`` and when it was last set or cleared.

        Changes are taken in the order of the clock read after each commit, the latest last:
        with several clients, the order they were recorded in is not their commits' order.
        Each such time is after its commit, so the one returned is after every commit so far
        (the sampler also skips a queue whose setting in the database is not this value).
        """
        value: int | None = None
        since: datetime | None = None
        for change in sorted(list(self.changes), key=lambda c: c.at):
            if change.queue != queue:
                continue
            if change.what == what:
                value, since = change.value, change.at
            elif change.what == "clear":
                value, since = None, change.at
        return value, since

    def paused(self, queue: str) -> bool:
        state = False
        for change in self.changes:
            if change.queue == queue and change.what in ("pause", "resume"):
                state = change.what == "pause"
        return state


@dataclass(frozen=True)
class Violation:
    """An invariant that did not hold: its name, the jobs concerned, and the evidence."""

    invariant: str
    jobs: tuple[int, ...]
    evidence: str

    def describe(self) -> str:
        jobs = ", ".join(map(str, self.jobs[:20])) or "-"
        return f"[{self.invariant}] jobs {jobs}: {self.evidence}"
