"""A worker's signals are acted on in a relay thread, never inside the signal handler."""

from __future__ import annotations

import os
import signal
import threading

from sa_jobqueue.worker._signals import relayed
from tests.helpers.waiting import wait_for


def test_a_signal_is_acted_on_while_the_main_thread_holds_the_lock_its_action_takes() -> None:
    # A stop sets the worker's events; the main thread holds an event's lock for a few
    # bytecodes in every Event.clear() and Event.wait(). A handler run there, in the main
    # thread, would wait for that lock forever.
    lock = threading.Lock()
    heard = threading.Event()
    acted: list[int] = []

    def on_signal(signum: int) -> None:
        heard.set()
        with lock:
            acted.append(signum)

    with relayed((signal.SIGUSR1,), on_signal):
        with lock:
            os.kill(os.getpid(), signal.SIGUSR1)
            assert heard.wait(10), "the signal never reached the relay"
            assert acted == []  # the action waits for the lock, in its own thread
        wait_for(lambda: acted, timeout=10)
        assert acted == [signal.SIGUSR1]


def test_the_previous_handlers_are_back_after_the_block_and_other_signals_are_not_relayed() -> None:
    before = signal.getsignal(signal.SIGUSR1)
    fd_before = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(fd_before)
    calls: list[int] = []
    heard = threading.Event()

    def on_signal(signum: int) -> None:
        calls.append(signum)
        heard.set()

    marker = threading.Event()
    previous_usr2 = signal.signal(signal.SIGUSR2, lambda signum, frame: marker.set())
    try:
        with relayed((signal.SIGUSR1,), on_signal):
            os.kill(os.getpid(), signal.SIGUSR2)  # handled by Python, written to the socket too
            os.kill(os.getpid(), signal.SIGUSR1)
            assert heard.wait(10)
        assert marker.is_set()
    finally:
        signal.signal(signal.SIGUSR2, previous_usr2)
    assert calls == [signal.SIGUSR1]
    assert signal.getsignal(signal.SIGUSR1) == before
    assert signal.set_wakeup_fd(fd_before) == fd_before  # no wakeup socket left behind
    assert not [t for t in threading.enumerate() if t.name == "sa_jobqueue-signals"]
