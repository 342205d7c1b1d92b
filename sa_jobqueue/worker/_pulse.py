"""The pulse: when each of the worker's loops last went round, for its liveness probe.

The claim loop and the heartbeat each beat once a turn. A loop that has not beaten within
the bound is stalled: stuck in something no deadline cuts, so the process no longer does its
work (claiming, or renewing its jobs' leases) though it is still running. Restarting it is
the cure, which is what a liveness probe is for; a database that does not answer is not a
stall (the loops go on retrying and beating), and is what the readiness probe reports.
"""

from __future__ import annotations

import time
from datetime import timedelta

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


class Pulse:
    """The last beat of each loop (``time.monotonic()``); nothing until the loops start.

    Beats are plain assignments, read without a lock: a reader sees a beat or the one
    before it, either of which answers "has it beaten lately".
    """

    def __init__(self) -> None:
        self._last: dict[str, float] = {}

    def beat(self, loop: str) -> None:
        """``loop`` went round now."""
        self._last[loop] = time.monotonic()

    def stalled(self, bound: timedelta) -> dict[str, float]:
        """The loops whose last beat is older than ``bound``, with its age in seconds."""
        now = time.monotonic()
        limit = bound.total_seconds()
        ages = {loop: now - at for loop, at in list(self._last.items())}
        return {loop: age for loop, age in ages.items() if age > limit}

    def clear(self) -> None:
        """The loops ended (the worker stopped): nothing is stalled any more."""
        self._last.clear()
