"""Lanes: queues that share job threads and a claim buffer, and the buffer's adaptive size;
which queues a worker serves by default, and which of them no task declares."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from queue import SimpleQueue
from typing import TYPE_CHECKING

from ._served import Served, is_pattern

if TYPE_CHECKING:
    from ..queue import JobQueue
    from ._claimed import Claimed
    from ._leases import Ticket

#: Takes a claimed attempt into a lane: to the event loop, or into the lane's buffer.
Submit = Callable[["Lane", "Claimed"], None]

#: The adaptive claim buffer (no explicit prefetch) grows while a full buffer drains faster
#: than PREFETCH_FAST seconds, shrinks while it takes longer than PREFETCH_SLOW, and stays
#: between 1 and PREFETCH_MAX_FACTOR times the concurrency.
PREFETCH_FAST = 0.05
PREFETCH_SLOW = 1.0
PREFETCH_MAX_FACTOR = 8


class Lane:
    """Queues that share a set of job threads and a claim buffer.

    A worker has one lane for all its queues, or, with a concurrency per queue, one lane per
    queue (or pattern): each then claims into its own threads and buffer, and a busy queue
    cannot take the threads of another. ``kinds`` is 2 when async handlers run on the event
    loop beside sync ones on threads: each kind gets the room of a whole lane, so one kind
    cannot fill the other's slots.

    The lane's state changes only through its methods, each named for the event that changes
    it. Who calls which: the lease table, under its lock, counts jobs in and out
    (:meth:`claimed`, :meth:`finished`, :meth:`round_ended`); the lane's claimer starts each
    round (:meth:`round_starts`); the runner moves jobs through the buffer (:meth:`put`,
    :meth:`next_ticket`), and the worker ends its threads (:meth:`finish_threads`). What it
    does not promise: a read from another thread is a snapshot (a count read without the
    lease table's lock may be one off), and the settings (``queues``, ``concurrency``,
    ``kinds``) are not to be changed once it is built.
    """

    def __init__(
        self, queues: list[str], concurrency: int, prefetch: int | None, kinds: int = 1
    ) -> None:
        self.queues = queues
        #: The queues as names and patterns: a lane with a pattern, or with more than one
        #: name, claims from all of them in one statement.
        self.served = Served(queues)
        self.concurrency = concurrency
        self.kinds = kinds
        # Jobs claimed ahead of free threads, so that one claim brings a batch. Left unset,
        # the buffer adapts: it doubles while jobs drain it within PREFETCH_FAST (short jobs:
        # fewer, larger claims) and halves while they take longer than PREFETCH_SLOW (long
        # jobs: do not sit on work another worker could start).
        self.adaptive = prefetch is None
        self._prefetch = concurrency if prefetch is None else prefetch
        self.max_prefetch = PREFETCH_MAX_FACTOR * concurrency
        self._filled_at = 0.0  # time.monotonic() of the last claim that filled the buffer
        self._saturated = False  # the last claim left work behind
        self._held = 0  # claimed and not finished
        # Claimed jobs on their way to a job thread; None tells a thread to finish.
        self._ready: SimpleQueue[Ticket | None] = SimpleQueue()

    # -- what it holds ------------------------------------------------------------------------

    @property
    def prefetch(self) -> int:
        """Jobs claimed ahead of free threads, at most (an adaptive buffer's current size)."""
        return self._prefetch

    @property
    def held(self) -> int:
        """Jobs claimed and not finished: running, or waiting in the buffer."""
        return self._held

    @property
    def saturated(self) -> bool:
        """Whether the last claim round left work behind (or found a queue at its cap)."""
        return self._saturated

    @property
    def capacity(self) -> int:
        """Jobs the lane holds at most: running, plus claimed and waiting for a thread."""
        return (self.concurrency + self._prefetch) * self.kinds

    @property
    def low_water(self) -> int:
        """Jobs held when the next claim goes out: the buffer is half empty, so the claim's
        round trip overlaps with the other half running, and each claim brings a batch."""
        return self.capacity - self._prefetch * self.kinds // 2

    @property
    def free(self) -> int:
        """Slots a claim may fill now: threads and buffer (negative if the buffer shrank)."""
        return self.capacity - self._held

    @property
    def idle(self) -> int:
        """Threads with no job, claimed or running (a limited queue claims for these only)."""
        return self.concurrency * self.kinds - self._held

    @property
    def above_low_water(self) -> bool:
        """Work was left behind, but the buffer is still more than half full: a claim now
        would bring only the few slots freed since the last one."""
        return self._saturated and self._held > self.low_water

    @property
    def ran_low(self) -> bool:
        """Work was left behind and the lane is down to its low water mark: its next claim
        brings a batch."""
        return self._saturated and self._held <= self.low_water

    # -- the claim round (the claim loop's thread) --------------------------------------------

    def round_starts(self) -> list[str]:
        """A claim round starts: the queues to claim from one by one (the lane's one queue;
        none for a lane of many queues, which are claimed in one statement that keeps its own
        turn between them: see ``claim_many``).

        Only a round that starts once the buffer has run low says how fast jobs drain it (a
        NOTIFY or a poll that arrives while the buffer is still full says nothing): then an
        adaptive buffer is resized, and timed afresh from the next claim that fills it.
        """
        if self._held <= self.low_water:
            self._adapt()
            self._filled_at = 0.0
        return [] if self.served.many else list(self.queues)

    def _adapt(self) -> None:
        """Resize an adaptive buffer from how fast the last full one drained."""
        if not self.adaptive or not self._filled_at:
            return
        drained_in = time.monotonic() - self._filled_at
        if drained_in < PREFETCH_FAST:
            self._prefetch = min(max(self._prefetch * 2, 1), self.max_prefetch)
        elif drained_in > PREFETCH_SLOW:
            self._prefetch = max(self._prefetch // 2, 1)

    # -- counted in and out (the lease table's lock held) -------------------------------------

    def claimed(self) -> None:
        """A job was claimed into the lane."""
        self._held += 1

    def finished(self, *, wake_always: bool) -> bool:
        """A job is done with its slot (or never got one); whether to wake the claim loop.

        A freed slot only matters if the last claim left work behind, and then once the
        buffer has run low, so the next claim brings a batch; ``wake_always`` (a burst, which
        must notice when the last job is done) wakes at every one. A wake answers the work
        left behind: until the next round says otherwise, the lane is not saturated.
        """
        self._held -= 1
        wake = wake_always or self.ran_low
        if wake:
            self._saturated = False
        return wake

    def round_ended(self, more: bool, capped: bool) -> None:
        """A claim round ended: ``more`` if it left work behind, ``capped`` if a queue was at
        its cap. Either way a freed slot is worth waking the claim loop for; only ``more``
        starts the clock on how fast the full buffer drains."""
        if more and not self._filled_at:
            self._filled_at = time.monotonic()
        self._saturated = more or capped

    # -- the buffer between the claim and the job threads -------------------------------------

    def put(self, ticket: Ticket) -> None:
        """A claimed job waits in the buffer for one of the lane's threads."""
        self._ready.put(ticket)

    def next_ticket(self, timeout: float | None = None) -> Ticket | None:
        """The next job for a thread (None: the thread is to finish), waiting up to
        ``timeout`` seconds (None: for ever); raises ``queue.Empty`` if none came."""
        return self._ready.get(timeout=timeout)

    @property
    def buffer_empty(self) -> bool:
        """Whether no claimed job waits for a thread (a snapshot)."""
        return self._ready.empty()

    def finish_threads(self) -> None:
        """Tell each of the lane's threads to finish once the jobs ahead of it are taken."""
        for _ in range(self.concurrency):
            self._ready.put(None)


class Intake:
    """Where claimed jobs go to run: the runner's ``submit``, attached by the runner itself.

    The one forward reference among the worker's collaborators, and why it cannot be undone
    by building them in another order: the runner writes each outcome through the recorder,
    and the recorder's batched completions claim the next jobs of a limited queue
    (``HandOff``), which the runner must then run. So the hand-off, built before the recorder
    and the runner, takes this port in its constructor, and the runner attaches to it in its
    own. Nothing is claimed before both exist; a job submitted earlier is a bug, and raises.
    """

    def __init__(self) -> None:
        self._submit: Submit | None = None

    def attach(self, submit: Submit) -> None:
        """The runner is built: from now on, jobs go to ``submit`` (once only)."""
        if self._submit is not None:
            raise RuntimeError("a runner is attached to this intake already")
        self._submit = submit

    def __call__(self, lane: Lane, job: Claimed) -> None:
        if self._submit is None:
            raise RuntimeError(f"job {job.id} claimed before a runner was attached")
        self._submit(lane, job)


def default_queues(queue: JobQueue) -> list[str]:
    """The queues a worker serves when told none: those the tasks declare, and the default."""
    return sorted(_declared_queues(queue))


def _declared_queues(queue: JobQueue) -> set[str]:
    """The queues the tasks declare, and the default queue (where undeclared ones go)."""
    return {task.queue for task in queue.tasks.values()} | {queue.default_queue}


def undeclared_queues(queue: JobQueue, served: Iterable[str]) -> list[str]:
    """The queues of ``served`` that no task of ``queue`` declares, in order.

    The JobQueue's ``default_queue`` is not counted: it is where a task declared without a
    queue goes. A queue listed here is not necessarily wrong (enqueue's ``queue=`` can send
    any task's jobs anywhere), which is why the worker warns and does not refuse.
    """
    declared = _declared_queues(queue)
    return [name for name in served if name not in declared and not is_pattern(name)]
