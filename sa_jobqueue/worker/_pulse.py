"""The pulse: when each of the worker's loops last went round, for its liveness probe.

The claim loop and the heartbeat each note the time of their turn (``last_turn``, a plain
attribute: the loop calls nothing here), and the pulse reads those notes. A loop that has
not gone round within the bound is stalled: stuck in something no deadline cuts, so the
process no longer does its work (claiming, or renewing its jobs' leases) though it is still
running. Restarting it is the cure, which is what a liveness probe is for; a database that
does not answer is not a stall (the loops go on retrying and turning), and is what the
readiness probe reports.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Protocol

from .._deadlines import STATEMENT_DEADLINE
from ._claimer import OUTAGE_RETRY_CAP

#: The loops that beat, by the name a probe reports.
CLAIM_LOOP = "claim loop"
HEARTBEAT = "heartbeat"


def stall_bound(poll_interval: timedelta) -> timedelta:
    """How long a live worker's loops may go without a beat, at most, with room to spare.

    The longest a healthy claim loop goes between turns is its longest wait (the poll
    interval, jittered up to 1.2 times, or OUTAGE_RETRY_CAP = 5 s while the database is out)
    plus one round of statements, each cut at the client-side STATEMENT_DEADLINE = 15 s (a
    claim, and the limits read after it): at the default 1 s poll, 5 + 2 x 15 = 35 s. The
    bound is twice that (70 s), so a slow moment is never taken for a stall. The heartbeat's
    longest turn (one renewal round, 15 s, or two statements: 30 s) is well within it.
    """
    wait = max(1.2 * poll_interval.total_seconds(), OUTAGE_RETRY_CAP)
    return timedelta(seconds=2 * (wait + 2 * STATEMENT_DEADLINE))


class Turning(Protocol):
    """A loop that notes when it last went round: ``time.monotonic()``, None before its first
    turn."""

    last_turn: float | None


class Pulse:
    """The loops of a run, by name, and how long since each went round; nothing until
    :meth:`watch` is given them.

    Turns are plain assignments, read without a lock: a reader sees a turn or the one before
    it, either of which answers "has it gone round lately".
    """

    def __init__(self) -> None:
        self._loops: dict[str, Turning] = {}

    def watch(self, loops: Mapping[str, Turning]) -> None:
        """Watch these loops (a run's), in place of any before."""
        self._loops = dict(loops)

    def stalled(self, bound: timedelta) -> dict[str, float]:
        """The loops whose last turn is older than ``bound``, with its age in seconds."""
        now = time.monotonic()
        limit = bound.total_seconds()
        turns = {name: loop.last_turn for name, loop in list(self._loops.items())}
        ages = {name: now - at for name, at in turns.items() if at is not None}
        return {name: age for name, age in ages.items() if age > limit}

    def clear(self) -> None:
        """The loops ended (the worker stopped): nothing is stalled any more."""
        self._loops = {}
