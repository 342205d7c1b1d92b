"""Claiming: each lane claims into its free slots; the claim loop decides when to claim next."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any, Final

from sqlalchemy.exc import SQLAlchemyError

from .._error_text import one_line
from .._sql import claim_limits, claim_many, claiming
from .._sql import queues as queues_sql
from ..database import HeldConnection
from ..models import RUNNING
from ._claimed import Claimed
from ._lanes import Lane
from ._leases import LeaseTable

log = logging.getLogger("sa_jobqueue.worker")

#: Longest wait between claim attempts while the database is unreachable (seconds).
OUTAGE_RETRY_CAP = 5.0
#: How long a lane follows its claim position in a queue before claiming from the head again
#: (seconds): the longest a job due before that position (a higher priority, an earlier
#: ``visible_at``) waits behind a saturated backlog for it, over the claim round's own time.
HEAD_EVERY: Final = 1.0

#: How long the worker trusts what it last read of which queues have a limit (seconds): a
#: limit set or removed reaches its claims within this (or the poll interval, if longer),
#: without a restart. The read is made after a claim round, never in front of one: a NOTIFY's
#: claim does not wait behind a second round trip.
LIMITS_EVERY: Final = 1.0

#: Longest wait for a rate window a burst worker will sit out (seconds): with nothing of its
#: own left to run, a burst claims again when a used-up window of a rate (or a rate per key)
#: opens within this, and exits otherwise. 10 s drains a queue limited per second or per few
#: seconds in one burst; a rate of so many per minute or hour would hold a cron job for that
#: long, so the burst leaves those jobs to the next run.
BURST_WINDOW_WAIT: Final = 10.0

#: Where in a queue's claim order the next claim starts: a job's ``Claimed.position()``.
Position = tuple[Any, ...]


def runnable(job: Claimed) -> bool:
    """Whether a claimed row is an attempt to run: not one the claim ended instead (a job
    lost on its last attempt, now dead, or cancelled meanwhile), which is logged."""
    if job.status == RUNNING:
        return True
    log.error("job %d (%s) lost its worker; not run again, now %s", job.id, job.task, job.status)
    return False


def limited_jobs(rows: list[Any]) -> list[Claimed]:
    """The jobs a limited claim's rows carry (besides the claim's own columns), each holding a
    slot; none when the claim took none (its one row then has no job)."""
    jobs = Claimed.of_rows([row for row in rows if row.id is not None])
    return [replace(job, holds_slot=True) for job in jobs]


class LimitedQueues:
    """Which queues have a limit (a cap or a rate), read again by :meth:`refresh` once what
    was read is ``LIMITS_EVERY`` old.

    Exactness does not rest on this being fresh: the plain claim takes nothing from a queue
    with a limit, so a worker that has not yet seen a new limit only claims nothing from that
    queue until the next refresh, and one that still thinks a removed limit is there claims
    through the limited claim, which works for any queue with a settings row. What it does
    not do: read on a claim's way, except the first time and after :meth:`forget`.
    """

    def __init__(self, conn: HeldConnection) -> None:
        self._conn = conn
        self._names: frozenset[str] = frozenset()
        self._keyed: frozenset[str] = frozenset()
        self._read_at = float("-inf")

    def __contains__(self, queue: str) -> bool:
        if self._read_at == float("-inf"):
            self._read()
        return queue in self._names

    def refresh(self) -> bool:
        """Read the limits again if what was read is ``LIMITS_EVERY`` old (or forgotten);
        whether which queues have a limit, or a cap per key, changed."""
        if time.monotonic() - self._read_at < LIMITS_EVERY:
            return False
        before = (self._names, self._keyed)
        self._read()
        return (self._names, self._keyed) != before

    def _read(self) -> None:
        rows = self._conn.rows(queues_sql.limited(), {}, again=True)
        self._names = frozenset(name for name, _ in rows)
        self._keyed = frozenset(name for name, keyed in rows if keyed)
        self._read_at = time.monotonic()

    @property
    def names(self) -> frozenset[str]:
        """The queues with a limit, as last read."""
        if self._read_at == float("-inf"):
            self._read()
        return self._names

    def keyed(self, queue: str) -> bool:
        """Whether ``queue`` had a cap per key when the limits were last read."""
        return queue in self._keyed

    def forget(self) -> None:
        """Read the limits again at the next question (a limited claim found none)."""
        self._read_at = float("-inf")


class LaneClaimer:
    """Claims jobs for one lane into its free slots, and hands each to ``submit``.

    What it does not do: run anything, or wait. One call is one claim per queue of the lane
    at most, on the worker's held claiming connection.
    """

    def __init__(
        self,
        lane: Lane,
        conn: HeldConnection,
        worker: str,
        leases: LeaseTable,
        submit: Callable[[Lane, Claimed], None],
        limited: LimitedQueues | None = None,
    ) -> None:
        self.lane = lane
        self._limited = limited
        self._conn = conn
        self._worker = worker
        self._leases = leases
        self._submit = submit
        # Per queue: past which row the next claim starts (None: the head), and when the
        # last claim from the head was (time.monotonic()).
        self._positions: dict[str, Position] = {}
        self._head_at: dict[str, float] = {}
        # Per rate-limited queue whose window is used up: when the next window opens, as the
        # database said (time.monotonic()). The lane claims from its other queues meanwhile.
        self.not_before: dict[str, float] = {}
        # Per queue with a rate per key that held some of its due jobs back: when that rate's
        # next window opens (time.monotonic()). Unlike ``not_before``, the queue is still
        # claimed from meanwhile: only the keys that used their window up are held.
        self.key_windows: dict[str, float] = {}
        # The many-queue claim's turn: the queue name its next claim starts past ('': the first).
        self._after_queue = ""
        self._rounds = 0
        #: The last round found a queue at its cap (or all threads busy with a limited queue
        #: waiting): due jobs are held back, not missing. A burst does not wait for it: its
        #: own jobs holding the slots keep it running anyway, and other workers' are not its
        #: to wait for.
        self.capped = False

    def _claim_jobs(self, queue: str, limit: int) -> tuple[list[Claimed], bool]:
        """Claim up to ``limit`` jobs of ``queue``; the jobs, and whether this was from the head.

        After a full claim the next one starts past the last row it took, so it does not step
        over the index entries the claimed jobs left at the head (see ``claim_after``). After a
        short claim, or once ``HEAD_EVERY`` has passed since the last claim from the head, it
        starts from the head, where a job due before the position (a higher priority, an
        earlier ``visible_at``, a lease expired long ago) is found.
        """
        params: dict[str, Any] = {"from_queue": queue, "limit": limit, "worker": self._worker}
        now = time.monotonic()
        position = self._positions.pop(queue, None)
        if position is not None and now - self._head_at.get(queue, now) < HEAD_EVERY:
            params.update(claiming.position_params(position))
            rows = self._conn.rows(claiming.claim_after(), params, as_text=True)
            head = False
        else:
            # As text: an idle worker's pickup waits on this statement alone.
            rows = self._conn.rows(claiming.claim(), params, as_text=True)
            self._head_at[queue] = now
            head = True
        jobs = Claimed.of_rows(rows)
        if len(jobs) == limit:
            self._positions[queue] = max(job.position() for job in jobs)
        return jobs, head

    def _claim_limited(self, queue: str, limit: int) -> tuple[list[Claimed], bool]:
        """Claim up to ``limit`` jobs of a queue with a limit; the jobs, and whether a limit
        (rather than an empty queue) may have cut the claim short.

        One statement (see ``claim_limits.claim_limited``). With the rate window used up, nothing
        is claimed and the queue is not asked again until the next window opens, at the time
        the database gave.
        """
        assert self._limited is not None
        keyed = self._limited.keyed(queue)
        params = {"from_queue": queue, "limit": limit, "worker": self._worker}
        statement = claim_limits.claim_limited(keyed=keyed)
        rows = self._conn.rows(statement, params)
        first = rows[0]
        room, wait, key_wait = first.room, first.wait, first.key_wait
        limited, has_keys = first.limited, first.keyed
        if not limited or has_keys != keyed:  # the limits changed since they were read
            self._limited.forget()
        if wait is not None:
            self.not_before[queue] = time.monotonic() + max(float(wait), 0.0)
        jobs = limited_jobs(rows)
        if key_wait is not None:
            # Some key's window is used up: claim again when the next one opens, and sooner
            # whenever woken (other keys' jobs may be enqueued, or freed by a finished job).
            self.key_windows[queue] = time.monotonic() + max(float(key_wait), 0.0)
        else:
            self.key_windows.pop(queue, None)
        held_by_key = key_wait is not None and len(jobs) < limit
        return jobs, (room < limit and len(jobs) == room) or held_by_key

    def _claim_many(self, limit: int) -> bool:
        """Claim up to ``limit`` jobs from the lane's unlimited queues in one statement, the
        queues taking turns (see ``claim_many``); whether more is probably waiting.

        The turn moves on: a claim that found ``limit`` ready queues (or more) leaves the
        next one to start past the last of them; one that found fewer reached the end of the
        names, and the next starts from the first. More is probably waiting when the claim
        came back full, when some queue gave its whole share, or when it started past a turn
        (the queues before it were not asked).
        """
        after = self._after_queue
        params = {
            **self.lane.served.params(after, limit),
            "after_queue": after,
            "limit": limit,
            "worker": self._worker,
        }
        rows = self._conn.rows(claim_many.claim_many(), params)
        jobs = Claimed.of_rows(rows)
        ready = rows[0].ready_queues if rows else 0
        self._after_queue = rows[0].last_queue if rows and ready >= limit else ""
        share = -(-limit // ready) if ready else limit
        per_queue: dict[str, int] = {}
        for job in jobs:
            per_queue[job.queue] = per_queue.get(job.queue, 0) + 1
            if runnable(job):
                self._submit(self.lane, job)
        gave_all = any(n >= share for n in per_queue.values())
        return len(jobs) >= limit or gave_all or bool(after)

    def claim(self) -> bool:
        """Claim into the lane's free slots: its one queue, or, for a lane of many queues, each
        limited queue it serves on its own and then all the others in one statement (see
        :meth:`_claim_many`). True if more is probably waiting.

        "Probably waiting" means a claim returned as many jobs as it asked for, a claim past a
        position came back short (the head has not been asked), or a queue was not asked at
        all because the slots ran out first.
        """
        lane = self.lane
        if lane.above_low_water:
            # Work is waiting, but the buffer is still more than half full: a claim now would
            # bring only the few slots freed since the last one (for jobs that write, about 6
            # a claim instead of half the buffer). The lease table wakes the loop at low water.
            return True
        more = False
        capped = False  # a queue at its cap: only a finished job can let more start
        queues = lane.round_starts()
        if lane.served.many:
            # The limited queues the lane serves, one claim each (there are few), then one
            # claim for all the others, however many.
            limited = self._limited.names if self._limited is not None else frozenset()
            queues = [queue for queue in sorted(limited) if queue in lane.served]
            # Each round starts one limited queue further on: none always goes first.
            self._rounds += 1
            if queues:
                turn = self._rounds % len(queues)
                queues = queues[turn:] + queues[:turn]
        for queue in queues:
            free = lane.free
            if free <= 0:
                more = True
                break
            if self._limited is not None and queue in self._limited:
                if self.not_before.get(queue, 0.0) > time.monotonic():
                    continue
                # No buffer for a limited queue: a claimed job holds a slot of the cap (and
                # its start counts against the rate) from the claim, so claim for idle
                # threads only. A job that ends wakes the loop to claim again.
                idle = lane.idle
                if idle <= 0:
                    capped = True
                    continue
                jobs, at_cap = self._claim_limited(queue, idle)
                more = more or len(jobs) == idle
                capped = capped or at_cap
            else:
                jobs, head = self._claim_jobs(queue, free)
                # A short claim past a position says nothing of the head: claim from there.
                more = more or len(jobs) == free or not head
            for job in jobs:
                if runnable(job):
                    self._submit(lane, job)
        if lane.served.many and lane.free > 0:
            more = self._claim_many(lane.free) or more
        self.capped = capped
        # Tell the lease table whether a freed slot is worth waking the claim loop for. At a
        # queue's cap, one of this lane's own jobs ending frees a slot of the cap, so it wakes
        # the loop too; the round still says "nothing more" (no claiming again at once, no
        # spinning at the cap). A lane holding none of the queue's jobs waits for its poll.
        self._leases.round_ended(lane, more, capped)
        return more

    def next_window(self) -> float | None:
        """When the earliest used-up rate window of the lane's queues, or of their keys, opens
        (monotonic)."""
        now = time.monotonic()
        for windows in (self.not_before, self.key_windows):
            for queue in [q for q, at in windows.items() if at <= now]:
                del windows[queue]
        return min([*self.not_before.values(), *self.key_windows.values()], default=None)


class ClaimLoop:
    """Claims until ``stopping`` is set (or, in a burst, until nothing is left to run).

    Between rounds it sleeps until ``wake`` (a NOTIFY, a freed slot, a periodic job) or the
    jittered poll; ``between_rounds`` (pruning) runs before a round once it is due, and says
    when it is next due (``time.monotonic()``). ``last_turn`` is when the loop last went round,
    for the liveness probe (see ``_pulse``). ``limits``
    are read again when due after each round, not before it: a claim woken by a NOTIFY goes
    out at once, its job's pickup not held up by that round trip.
    """

    def __init__(
        self,
        claimers: list[LaneClaimer],
        leases: LeaseTable,
        *,
        poll_interval: timedelta,
        wake: threading.Event,
        stopping: threading.Event,
        between_rounds: Callable[[], float],
        completing: Callable[[], bool] = lambda: False,
        limits: LimitedQueues | None = None,
    ) -> None:
        self._claimers = claimers
        self.last_turn: float | None = None
        self._limits = limits
        self._lanes = [c.lane for c in claimers]
        self._leases = leases
        self._poll_interval = poll_interval
        self._wake = wake
        self._stopping = stopping
        self._between_rounds = between_rounds
        self._next_between = 0.0  # time.monotonic() when between_rounds is next due
        self._completing = completing

    def run(self, burst: bool) -> None:
        """Claim and wait, round after round."""
        outage = 0  # claims failed in a row
        while not self._stopping.is_set():
            self.last_turn = now = time.monotonic()
            # Clear before claiming: a NOTIFY that lands after the claim's snapshot sets the
            # event again and the wait below returns at once, so no wake-up is lost.
            self._wake.clear()
            if now >= self._next_between:
                self._next_between = self._between_rounds()
            changed = False  # which queues have a limit, as read after this round
            try:
                more = self._round()
                changed = self._limits is not None and self._limits.refresh()
            except SQLAlchemyError as exc:  # the server, the network, or a pool time-out
                # Said once per outage, not once per try.
                if not outage:
                    log.warning("cannot claim (%s); retrying", one_line(exc))
                outage += 1
                more = False
            else:
                if outage:
                    log.info("claiming again: the database is back")
                outage = 0
            if changed:
                continue  # a limit set or removed: claim again at once, through the claim that fits
            running, room = self._leases.busy(self._lanes)
            if more and room:
                continue  # work is waiting and slots are free (fast jobs already finished)
            # A rate limit's next window opens at a time the database gave: wake for it.
            windows = [w for w in (c.next_window() for c in self._claimers) if w is not None]
            window = min(windows) - time.monotonic() if windows else None
            # A burst ends once nothing of its own runs or waits to be written and the round
            # started all it could. What still holds due jobs then is out of its hands (a
            # pause, a cap whose slots other workers hold, a dependency it is not running), or
            # a rate window: only one that opens soon is worth waiting for.
            # A wake since the round began (a completion written meanwhile, which may have
            # released a job the round did not see yet) is a reason to claim again: the
            # completer wakes the loop before it stops counting its batch as pending.
            idle = (
                burst
                and not more
                and not running
                and not self._completing()
                and not self._wake.is_set()
            )
            if idle and (window is None or window > BURST_WINDOW_WAIT):
                return
            # With work waiting, a finishing job sets the event. Without, only a NOTIFY (or
            # the poll, jittered so idle workers do not poll in lockstep) can bring more.
            # During an outage the retries back off, up to OUTAGE_RETRY_CAP.
            interval = self._poll_interval.total_seconds() * random.uniform(0.8, 1.2)
            if outage:
                interval = min(interval * 2 ** min(outage - 1, 10), OUTAGE_RETRY_CAP)
            if window is not None:
                interval = max(min(interval, window), 0.0)
            self._wake.wait(interval)

    def _round(self) -> bool:
        """Claim into every lane's free slots. True if more work is probably waiting."""
        more = False
        for claimer in self._claimers:
            more = claimer.claim() or more
        return more
