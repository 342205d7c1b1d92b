"""The lease table: the attempts this worker holds, and whether each is still its own.

One lock guards everything a job's way through the worker changes on more than one thread:
the held attempts (what the heartbeat renews and times out), the tickets of claimed jobs (what
shutdown waits for), each lane's count of held jobs (changed by the lane's own methods, called
here under the lock), and the open groups. Each method is one short critical section, as each
step of a job's way is; none does I/O.

What it does not know: whether the database still agrees. An attempt held here may have lost
its lease already; the heartbeat finds out at its next renewal, and the fence in every
statement has the last word.
"""

from __future__ import annotations

import enum
import math
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from .._backoff import Backoff
from ..observability import JobRun
from ..tasks import JobContext, Task
from ._claimed import Claimed
from ._lanes import Lane

#: How soon a lease whose row was locked by another transaction is renewed again (seconds).
HEARTBEAT_RETRY = 0.5


class Stage(enum.Enum):
    """Where a claimed job is on its way through the worker."""

    WAITING = "waiting"  # claimed, in its lane's buffer until a thread takes it
    RUNNING = "running"
    CANCELLED = "cancelled"  # handed back on shutdown before any thread took it
    LOST = "lost"  # its lease ran out, or was lost, before any thread took it: not started
    DONE = "done"


class Ticket:
    """A claimed job's place in this worker, from its claim until its slot is free again.

    What a ``concurrent.futures.Future`` would do here, for a fraction of its cost (a Future
    makes a Condition, and its lock, for every job): the lease table's lock guards the stage,
    and shutdown waits on the table, not on each ticket.
    """

    __slots__ = ("job", "lane", "stage")

    def __init__(self, job: Claimed, lane: Lane) -> None:
        self.job = job
        self.lane = lane
        self.stage = Stage.WAITING


@dataclass
class Held:
    """What the heartbeat needs to know about one attempt this worker is running."""

    attempt: int
    lease: timedelta
    renew_at: float  # time.monotonic() of the next renewal
    ctx: JobContext | None = None
    task: Task | None = None
    deadline: float | None = None  # time.monotonic() when the task's timeout runs out
    grouped: bool = False  # finished, its completion waiting for its group's commit
    run: JobRun | None = None  # for observers
    backoff: Backoff | None = None  # the job's own retry policy, if enqueue gave one
    #: time.monotonic() by which the lease has run out unless renewed: the claim's or the last
    #: renewal's time here plus the lease (see :meth:`LeaseTable.take`).
    expires: float = math.inf
    lost: bool = False  # a renewal found the attempt no longer this worker's


class LeaseTable:
    """The claimed attempts of one worker, from claim to settlement, under one lock.

    With ``burst``, every finished job wakes the claim loop, which must notice when the last
    one is done.
    """

    def __init__(self, *, burst: bool = False) -> None:
        self._lock = threading.Lock()
        self._all_done = threading.Condition(self._lock)  # no ticket left
        self._held: dict[int, Held] = {}
        # Not done yet, in claim order (a dict as an ordered set); read without the lock only
        # as a snapshot.
        self.tickets: dict[Ticket, None] = {}
        self.groups_open = 0  # groups whose commit is still to come (a burst waits for them)
        self._burst = burst
        self._shutting_down = False

    @property
    def burst(self) -> bool:
        """Whether the worker runs a burst: every finished job and group wakes the claim loop."""
        return self._burst

    def _current(self, job_id: int, attempt: int) -> Held | None:
        """The held attempt, if it is this one (call with the lock held).

        A timed-out attempt that ran on can finish after this worker claimed the job's next
        attempt: only the attempt's own entry may be changed or removed by it.
        """
        held = self._held.get(job_id)
        return held if held is not None and held.attempt == attempt else None

    # -- a job's way: claimed, started, finished --------------------------------------------

    def hold(self, lane: Lane, job: Claimed) -> Ticket:
        """Register a claimed attempt: its lease is renewed from now on."""
        # The first renewal a third of the lease after the claim, so two can fail in a row.
        now, lease = time.monotonic(), job.lease.total_seconds()
        ticket = Ticket(job, lane)
        with self._lock:
            lane.claimed()
            self._held[job.id] = Held(job.attempts, job.lease, now + lease / 3, expires=now + lease)
            self.tickets[ticket] = None
        return ticket

    def hold_running(self, lane: Lane, jobs: list[Claimed]) -> list[Ticket]:
        """:meth:`hold` and :meth:`take` for many attempts at once, under one lock: the jobs a
        batch task's thread claimed for the batch it runs."""
        tickets = []
        now = time.monotonic()
        with self._lock:
            for job in jobs:
                ticket = Ticket(job, lane)
                ticket.stage = Stage.RUNNING
                lane.claimed()
                lease = job.lease.total_seconds()
                self._held[job.id] = Held(
                    job.attempts, job.lease, now + lease / 3, expires=now + lease
                )
                self.tickets[ticket] = None
                tickets.append(ticket)
        return tickets

    def start_many(
        self, jobs: list[Claimed], contexts: list[JobContext], task: Task, backoffs: list[Backoff]
    ) -> None:
        """:meth:`start` for the jobs of a batch, under one lock (no observers' runs)."""
        deadline = None if task.timeout is None else time.monotonic() + task.timeout.total_seconds()
        with self._lock:
            for job, ctx, backoff in zip(jobs, contexts, backoffs, strict=True):
                held = self._current(job.id, job.attempts)
                if held is not None:
                    held.ctx, held.task, held.backoff = ctx, task, backoff
                    ctx._shutdown = self._shutting_down
                    held.deadline = deadline

    def let_go_many(self, tickets: list[Ticket]) -> bool:
        """:meth:`let_go` for many tickets, under one lock; True if the claim loop should be
        woken."""
        wake = False
        with self._lock:
            for ticket in tickets:
                wake = self._let_go(ticket) or wake
        return wake

    def take(self, ticket: Ticket) -> bool:
        """A thread takes the job to run it; False if shutdown handed it back first, or if the
        attempt is no longer this worker's to start (then :attr:`Stage.LOST`, let go here).

        No longer its own: a renewal found it lost, or its lease ran out while it waited in
        the buffer (the worker stalled, or its renewals failed, for longer than the lease, by
        ``time.monotonic()``, which a suspended machine's clock does not count: then only a
        renewal finds it). Its job is someone else's to run, or soon will be: started here,
        its handler would run beside that attempt. The caller hands it back (fenced).
        """
        with self._lock:
            if ticket.stage is not Stage.WAITING:
                return False
            held = self._current(ticket.job.id, ticket.job.attempts)
            if held is None or held.lost or time.monotonic() >= held.expires:
                ticket.stage = Stage.LOST
                self._let_go(ticket)
                return False
            ticket.stage = Stage.RUNNING
            return True

    def start(
        self, job: Claimed, ctx: JobContext, task: Task, run: JobRun | None, backoff: Backoff
    ) -> None:
        """Its handler starts: arm its timeout, and let the heartbeat reach its context."""
        with self._lock:
            held = self._current(job.id, job.attempts)
            if held is not None:
                held.ctx, held.task, held.run, held.backoff = ctx, task, run, backoff
                ctx._shutdown = self._shutting_down
                if task.timeout is not None:
                    held.deadline = time.monotonic() + task.timeout.total_seconds()

    def await_group(self, job: Claimed) -> None:
        """Its handler is done and its completion waits for the group's commit.

        The lease is still renewed until then; the timeout no longer applies.
        """
        with self._lock:
            held = self._current(job.id, job.attempts)
            if held is not None:
                held.grouped, held.ctx, held.deadline = True, None, None

    def let_go(self, ticket: Ticket) -> bool:
        """The job is done with its thread (or never got one): free its slot.

        True if the claim loop should be woken.
        """
        with self._lock:
            return self._let_go(ticket)

    def _let_go(self, ticket: Ticket) -> bool:
        lane, job = ticket.lane, ticket.job
        if ticket.stage not in (Stage.CANCELLED, Stage.LOST):
            ticket.stage = Stage.DONE
        self.tickets.pop(ticket, None)
        wake = lane.finished(wake_always=self._burst)
        # A job whose completion waits for its group's commit keeps its lease renewed.
        held = self._current(job.id, job.attempts)
        if held is not None and not held.grouped:
            del self._held[job.id]
        if not self.tickets:
            self._all_done.notify_all()
        return wake

    def forget(self, jobs: list[Claimed]) -> None:
        """Stop renewing a group's attempts once it has committed or rolled back."""
        with self._lock:
            for job in jobs:
                if self._current(job.id, job.attempts) is not None:
                    del self._held[job.id]

    # -- the claim loop's view --------------------------------------------------------------

    def round_ended(self, lane: Lane, more: bool, capped: bool) -> None:
        """A claim round for the lane ended (see :meth:`Lane.round_ended`): whether it left
        work behind, or found a queue at its cap (a freed slot then wakes the loop)."""
        with self._lock:
            lane.round_ended(more, capped)

    def busy(self, lanes: list[Lane]) -> tuple[int, bool]:
        """Jobs and groups still running, and whether a lane with work waiting has run low.

        Run low: down to its low water mark, so that the next claim brings a batch.
        """
        with self._lock:
            running = len(self.tickets) + self.groups_open
            room = any(lane.ran_low for lane in lanes)
        return running, room

    def shut_down(self) -> None:
        """The worker is shutting down: ask every running handler, and any still to start, to
        stop (``ctx.stop_requested``); what each then does is settled as usual."""
        with self._lock:
            self._shutting_down = True
            for held in self._held.values():
                if held.ctx is not None:
                    held.ctx._shutdown = True

    def hand_back_waiting(self) -> list[Claimed]:
        """On shutdown: the claimed jobs no thread has taken, no longer to be taken."""
        with self._lock:
            waiting = [t for t in self.tickets if t.stage is Stage.WAITING]
            for ticket in waiting:
                ticket.stage = Stage.CANCELLED
                self._let_go(ticket)
        return [ticket.job for ticket in waiting]

    def wait_all_done(self, timeout: float) -> list[Claimed]:
        """Wait up to ``timeout`` seconds for every claimed job to finish; those that did not."""
        with self._all_done:
            self._all_done.wait_for(lambda: not self.tickets, timeout)
            return [ticket.job for ticket in self.tickets]

    def group_opened(self) -> None:
        """A job thread opened a group transaction."""
        with self._lock:
            self.groups_open += 1

    def group_closed(self) -> None:
        """A group committed or rolled back."""
        with self._lock:
            self.groups_open -= 1

    # -- the heartbeat's view ---------------------------------------------------------------

    def snapshot(self) -> dict[int, Held]:
        """The attempts held now (the entries themselves: their renewal time is the
        heartbeat's to change)."""
        with self._lock:
            return dict(self._held)

    def ours(self, held: Mapping[int, Held]) -> set[int]:
        """The attempts of ``held`` that are still held, as they were (not finished since)."""
        with self._lock:
            return {i for i, h in held.items() if self._held.get(i) is h}

    def drop(self, job_id: int, held: Held) -> None:
        """Stop renewing this attempt (its timeout is being recorded)."""
        with self._lock:
            if self._held.get(job_id) is held:
                del self._held[job_id]


def overdue(held: Mapping[int, Held], now: float) -> list[int]:
    """The attempts of ``held`` past their task's timeout."""
    return [i for i, h in held.items() if h.deadline is not None and h.deadline <= now]


def renewal_due(held: Mapping[int, Held], now: float) -> bool:
    """Whether any attempt of ``held`` is due for renewal (then all are renewed at once)."""
    return any(h.renew_at <= now for h in held.values())


def schedule_renewals(held: Mapping[int, Held], now: float, busy: set[int]) -> None:
    """After a renewal sent at ``now``: the next a third of the lease on, or soon for rows
    locked just now; the lease runs to ``now`` plus its length for those renewed."""
    for job_id, h in held.items():
        if job_id in busy:  # a row locked by someone else for now: try again in a moment
            h.renew_at = now + HEARTBEAT_RETRY
        else:
            lease = h.lease.total_seconds()
            h.renew_at, h.expires = now + lease / 3, now + lease


def schedule_retries(held: Mapping[int, Held], now: float) -> None:
    """After a failed renewal: try again soon, but not on every tick (a tenth of the lease,
    at least half a second)."""
    for h in held.values():
        h.renew_at = now + max(h.lease.total_seconds() / 10, 0.5)
