"""Lanes: capacity, the low-water mark that paces claims, and the adaptive claim buffer."""

from __future__ import annotations

from queue import Empty
from types import SimpleNamespace
from typing import cast

import pytest

from sa_jobqueue.worker import _lanes
from sa_jobqueue.worker._claimed import Claimed
from sa_jobqueue.worker._lanes import PREFETCH_MAX_FACTOR, Intake, Lane
from sa_jobqueue.worker._leases import Ticket


def test_capacity_is_threads_plus_buffer_per_kind_and_claims_go_out_half_empty() -> None:
    lane = Lane(["a", "b"], 4, 6)
    assert (lane.capacity, lane.low_water) == (10, 7)
    # Async handlers beside sync ones: each kind gets a whole lane's room.
    both = Lane(["a", "b"], 4, 6, kinds=2)
    assert (both.capacity, both.low_water) == (20, 14)
    assert Lane(["a"], 3, 0).low_water == 3  # no buffer: claim as soon as a thread is free


class Clock:
    """time.monotonic, moved by hand."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 100.0
        monkeypatch.setattr(_lanes.time, "monotonic", lambda: self.now)


def drained_in(lane: Lane, clock: Clock, seconds: float) -> None:
    """A claim fills the lane's buffer, and the next round starts ``seconds`` later."""
    lane.round_ended(more=True, capped=False)
    clock.now += seconds
    lane.round_starts()


def test_an_unset_prefetch_starts_at_the_concurrency_and_adapts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock(monkeypatch)
    lane = Lane(["a"], 4, None)
    assert lane.prefetch == 4
    lane.round_starts()  # never filled: nothing to learn from
    assert lane.prefetch == 4
    drained_in(lane, clock, 0.0)  # drained at once: short jobs
    assert lane.prefetch == 8
    for _ in range(10):
        drained_in(lane, clock, 0.0)
    assert lane.prefetch == PREFETCH_MAX_FACTOR * 4
    drained_in(lane, clock, 5.0)  # took long: long jobs
    assert lane.prefetch == 16
    for _ in range(10):
        drained_in(lane, clock, 5.0)
    assert lane.prefetch == 1


def test_a_round_that_starts_above_low_water_learns_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock(monkeypatch)
    lane = Lane(["a"], 4, None)  # capacity 8, low water 6
    for _ in range(7):
        lane.claimed()
    lane.round_ended(more=True, capped=False)
    clock.now += 5.0
    lane.round_starts()  # a NOTIFY while the buffer is still full says nothing
    assert lane.prefetch == 4
    lane.finished(wake_always=False)
    lane.round_starts()  # at low water: the buffer took 5 s to drain, so it halves
    assert lane.prefetch == 2


def test_a_fixed_prefetch_never_adapts(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(monkeypatch)
    lane = Lane(["a"], 4, 3)
    drained_in(lane, clock, 0.0)
    assert lane.prefetch == 3


def test_a_lane_of_many_queues_leaves_their_turns_to_its_one_claim() -> None:
    assert Lane(["a"], 1, 0).round_starts() == ["a"]
    assert Lane(["a", "b", "c"], 1, 0).round_starts() == []
    assert Lane(["tenant-*"], 1, 0).round_starts() == []


def test_the_buffer_hands_jobs_to_threads_then_tells_each_thread_to_finish() -> None:
    lane = Lane(["a"], 2, 0)
    ticket = cast(Ticket, object())
    lane.put(ticket)
    assert not lane.buffer_empty
    lane.finish_threads()
    assert [lane.next_ticket(), lane.next_ticket(), lane.next_ticket()] == [ticket, None, None]
    assert lane.buffer_empty
    with pytest.raises(Empty):
        lane.next_ticket(timeout=0.01)


def test_the_intake_passes_jobs_to_the_runner_attached_once() -> None:
    intake, lane = Intake(), Lane(["a"], 1, 0)
    job = cast(Claimed, SimpleNamespace(id=7))
    with pytest.raises(RuntimeError, match="before a runner was attached"):
        intake(lane, job)
    taken: list[tuple[Lane, Claimed]] = []
    intake.attach(lambda lane, job: taken.append((lane, job)))
    intake(lane, job)
    assert taken == [(lane, job)]
    with pytest.raises(RuntimeError, match="already"):
        intake.attach(lambda lane, job: None)
