"""Signals acted on in a thread of their own, not in the signal handler.

Python runs a signal handler in the main thread between two bytecodes, wherever that thread
is: possibly inside ``Event.clear()``, holding the event's lock. A handler that then calls
``Event.set()`` on the same event waits for a lock its own thread holds, forever, and a second
signal cannot help (Python does not run a handler inside another). Stopping a worker sets
events, so the handler installed here does nothing: the C-level handler writes the signal's
number to a socket (``signal.set_wakeup_fd``), and a thread reading it calls back, as any
other thread would.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import signal
import socket
import threading
from collections.abc import Callable, Collection, Iterator
from types import FrameType

log = logging.getLogger("sa_jobqueue.worker")

#: How long a signalled worker process may take, past its shutdown grace and STOP_MARGIN, to
#: dispose of its engines and exit (seconds) before :func:`exit_by` ends it.
EXIT_SLACK = 5.0


@contextlib.contextmanager
def relayed(signals: Collection[int], callback: Callable[[int], None]) -> Iterator[None]:
    """While in the block, call ``callback(signum)`` from a relay thread for each of
    ``signals`` received. Only in the main thread (as ``signal.signal``)."""
    readable, writable = socket.socketpair()
    writable.setblocking(False)  # the wakeup fd must not block the C handler
    previous_fd = signal.set_wakeup_fd(writable.fileno(), warn_on_full_buffer=False)
    previous = {signum: signal.signal(signum, _noted) for signum in signals}
    relay = threading.Thread(
        target=_relay,
        args=(readable, frozenset(signals), callback),
        name="sa_jobqueue-signals",
        daemon=True,
    )
    relay.start()
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        signal.set_wakeup_fd(previous_fd)
        writable.close()  # the relay reads the end of the stream and returns
        relay.join(timeout=5.0)
        readable.close()


def _noted(signum: int, frame: FrameType | None) -> None:
    """The Python-level handler: the signal was already written to the wakeup socket."""


def _relay(
    readable: socket.socket, signals: frozenset[int], callback: Callable[[int], None]
) -> None:
    while data := readable.recv(64):
        for signum in data:
            if signum in signals:  # the wakeup fd carries every signal Python handles
                try:
                    callback(signum)
                except Exception:
                    log.exception("handling signal %d failed", signum)


def exit_by(stop_seconds: float) -> None:
    """End this process with status 1 if it is still running EXIT_SLACK seconds after
    ``stop_seconds`` from now (by when its stopped worker's :meth:`Worker.run` has returned),
    its threads' stacks written to stderr first (``faulthandler``).

    For a worker process told to stop: :meth:`Worker.run` returns within its grace and
    STOP_MARGIN whatever the network does, but a process can still be held up past that,
    by a thread it cannot interrupt; it exits all the same, saying where each thread was.
    Its running jobs are reclaimed once their leases expire, as after a second signal.
    """
    faulthandler.dump_traceback_later(stop_seconds + EXIT_SLACK, exit=True)
