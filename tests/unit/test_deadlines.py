"""The deadline watchdog: a statement past its deadline has its socket shut down, and a
stopping worker's statements are hurried (real sockets, no database)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from sa_jobqueue._deadlines import STOP_HURRY, Deadlines, StopClock


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, theirs = socket.socketpair()
    try:
        yield ours, theirs
    finally:
        ours.close()
        theirs.close()


def cut_within(sock: socket.socket, seconds: float) -> bool:
    """Whether ``sock`` was shut down within ``seconds`` (its read returns end of file)."""
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False


def test_a_statement_past_its_deadline_is_cut(pair: tuple[socket.socket, socket.socket]) -> None:
    ours, _ = pair
    deadlines = Deadlines()
    token = deadlines.arm(ours.fileno(), 0.2)
    assert cut_within(ours, 5)
    assert deadlines.disarm(token)  # the caller learns its connection was cut


def test_a_stop_hurries_a_statement_already_waiting_without_telling_the_watchdog(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    ours, _ = pair
    deadlines, clock = Deadlines(), StopClock()
    token = deadlines.arm(ours.fileno(), 60.0, clock)
    assert not cut_within(ours, 0.3)
    clock.stop(0.5)  # as a signal handler does: no lock, no notice
    started = time.monotonic()
    assert cut_within(ours, 5)
    assert time.monotonic() - started < 2
    assert deadlines.disarm(token)


def test_the_clock_caps_deadlines_by_when_the_worker_must_be_gone() -> None:
    clock = StopClock()
    assert clock.left() == float("inf")
    assert clock.cap(15.0, 1.0) == 15.0  # no stop yet: a deadline stands as it is
    clock.stop(10.0)
    assert clock.stopped_at is not None
    armed_before = clock.stopped_at - 1.0
    # Armed before the stop: STOP_HURRY more seconds from the stop at most.
    assert clock.cap(armed_before + 15.0, armed_before) == clock.stopped_at + STOP_HURRY
    # Armed after it: its own deadline, but never past the moment the worker must be gone.
    assert clock.cap(clock.stopped_at + 1.0, clock.stopped_at + 0.5) == clock.stopped_at + 1.0
    assert clock.cap(clock.stopped_at + 60.0, clock.stopped_at + 0.5) == clock.until
    assert 9.0 < clock.left() <= 10.0
    clock.stop(100.0)  # once only
    assert clock.left() <= 10.0
