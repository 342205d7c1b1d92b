"""Lanes: capacity, the low-water mark that paces claims, and the adaptive claim buffer."""

from __future__ import annotations

import time

from sa_jobqueue.worker._lanes import PREFETCH_MAX_FACTOR, Lane


def test_capacity_is_threads_plus_buffer_per_kind_and_claims_go_out_half_empty() -> None:
    lane = Lane(["a", "b"], 4, 6)
    assert (lane.capacity, lane.low_water) == (10, 7)
    lane.kinds = 2  # async handlers beside sync ones: each kind gets a whole lane's room
    assert (lane.capacity, lane.low_water) == (20, 14)
    assert Lane(["a"], 3, 0).low_water == 3  # no buffer: claim as soon as a thread is free


def test_an_unset_prefetch_starts_at_the_concurrency_and_adapts() -> None:
    lane = Lane(["a"], 4, None)
    assert lane.prefetch == 4
    lane.adapt()  # never filled: nothing to learn from
    assert lane.prefetch == 4
    lane.filled_at = time.monotonic()  # drained at once: short jobs
    lane.adapt()
    assert lane.prefetch == 8
    for _ in range(10):
        lane.filled_at = time.monotonic()
        lane.adapt()
    assert lane.prefetch == PREFETCH_MAX_FACTOR * 4
    lane.filled_at = time.monotonic() - 5  # took long: long jobs
    lane.adapt()
    assert lane.prefetch == 16
    for _ in range(10):
        lane.filled_at = time.monotonic() - 5
        lane.adapt()
    assert lane.prefetch == 1


def test_a_fixed_prefetch_never_adapts() -> None:
    lane = Lane(["a"], 4, 3)
    lane.filled_at = time.monotonic()
    lane.adapt()
    assert lane.prefetch == 3
