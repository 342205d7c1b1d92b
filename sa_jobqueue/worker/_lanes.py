"""Lanes: queues that share job threads and a claim buffer, and the buffer's adaptive size."""

from __future__ import annotations

import asyncio
import time
from queue import SimpleQueue
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._leases import Ticket

#: The adaptive claim buffer (no explicit prefetch) grows while a full buffer drains faster
#: than PREFETCH_FAST seconds, shrinks while it takes longer than PREFETCH_SLOW, and stays
#: between 1 and PREFETCH_MAX_FACTOR times the concurrency.
PREFETCH_FAST = 0.05
PREFETCH_SLOW = 1.0
PREFETCH_MAX_FACTOR = 8


class Lane:
    """Queues that share a set of job threads and a claim buffer.

    A worker has one lane for all its queues, or, with a concurrency per queue, one lane per
    queue: each then claims into its own threads and buffer, and a busy queue cannot take the
    threads of another. ``held`` and ``saturated`` change only under the lease table's lock.
    """

    def __init__(self, queues: list[str], concurrency: int, prefetch: int | None) -> None:
        self.queues = queues
        self.concurrency = concurrency
        # Jobs claimed ahead of free threads, so that one claim brings a batch. Left unset,
        # the buffer adapts: it doubles while jobs drain it within PREFETCH_FAST (short jobs:
        # fewer, larger claims) and halves while they take longer than PREFETCH_SLOW (long
        # jobs: do not sit on work another worker could start).
        self.adaptive = prefetch is None
        self.prefetch = concurrency if prefetch is None else prefetch
        self.max_prefetch = PREFETCH_MAX_FACTOR * concurrency
        self.filled_at = 0.0  # time.monotonic() of the last claim that filled the buffer
        self.saturated = False  # the last claim left work behind
        self.rotation = 0
        self.held = 0  # claimed and not finished
        # 2 when async handlers run on the event loop beside sync ones on threads: each kind
        # gets the room of a whole lane, so one kind cannot fill the other's slots.
        self.kinds = 1
        # Claimed jobs on their way to a job thread; None tells a thread to finish.
        self.ready: SimpleQueue[Ticket | None] = SimpleQueue()
        # How many of the lane's async handlers run at once (made on the event loop).
        self.async_slots: asyncio.Semaphore | None = None

    @property
    def capacity(self) -> int:
        """Jobs the lane holds at most: running, plus claimed and waiting for a thread."""
        return (self.concurrency + self.prefetch) * self.kinds

    @property
    def low_water(self) -> int:
        """Jobs held when the next claim goes out: the buffer is half empty, so the claim's
        round trip overlaps with the other half running, and each claim brings a batch."""
        return self.capacity - self.prefetch * self.kinds // 2

    def adapt(self) -> None:
        """Resize an adaptive buffer from how fast the last full one drained."""
        if not self.adaptive or not self.filled_at:
            return
        drained_in = time.monotonic() - self.filled_at
        if drained_in < PREFETCH_FAST:
            self.prefetch = min(max(self.prefetch * 2, 1), self.max_prefetch)
        elif drained_in > PREFETCH_SLOW:
            self.prefetch = max(self.prefetch // 2, 1)
