"""The pulse the liveness probe reads, and the bound it is read against."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta

from sa_jobqueue.worker._pulse import CLAIM_LOOP, HEARTBEAT, Pulse, stall_bound


def test_the_default_bound_covers_an_outage_wait_and_two_statement_deadlines_twice() -> None:
    # 2 x (the 5 s retry cap + 2 x the 15 s statement deadline) at any poll under 5 / 1.2 s.
    assert stall_bound(timedelta(seconds=1)) == timedelta(seconds=70)
    assert stall_bound(timedelta(milliseconds=100)) == timedelta(seconds=70)
    # A long poll waits longer than the retry cap: 2 x (1.2 x 60 + 30).
    assert stall_bound(timedelta(seconds=60)) == timedelta(seconds=204)


@dataclass
class Loop:
    last_turn: float | None = None


def test_a_loop_is_stalled_once_its_last_turn_is_older_than_the_bound() -> None:
    pulse = Pulse()
    assert pulse.stalled(timedelta(0)) == {}  # nothing before the loops are watched
    claims, heartbeat = Loop(), Loop()
    pulse.watch({CLAIM_LOOP: claims, HEARTBEAT: heartbeat})
    assert pulse.stalled(timedelta(0)) == {}  # nor before their first turns
    claims.last_turn = heartbeat.last_turn = time.monotonic()
    assert pulse.stalled(timedelta(seconds=60)) == {}
    claims.last_turn = time.monotonic() - 10  # its last turn ten seconds ago
    stalled = pulse.stalled(timedelta(seconds=5))
    assert list(stalled) == [CLAIM_LOOP]
    assert stalled[CLAIM_LOOP] >= 10
    pulse.clear()
    assert pulse.stalled(timedelta(0)) == {}
