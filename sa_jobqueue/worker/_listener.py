"""The worker's LISTEN connection: wakes the claim loop when a job lands in one of its queues."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Container

import psycopg
from psycopg import sql
from sqlalchemy import Engine

from .._deadlines import DEADLINES, StopClock
from .._error_text import one_line
from .._sql import enqueue as enqueue_sql
from ..database import CONNECT_ARGS

log = logging.getLogger("sa_jobqueue.worker")

#: Longest wait before reconnecting after the LISTEN connection failed (seconds).
RECONNECT_CAP = 5.0
#: After this long without a notification, the listener makes sure its connection still
#: answers (seconds).
LISTEN_PING = 10.0


def listen(
    engine: Engine,
    queues: Container[str],
    wake: threading.Event,
    stopping: threading.Event,
    clock: StopClock | None = None,
) -> None:
    """Hold one LISTEN connection until ``stopping``; reconnect after any failure. Its ping
    on a quiet connection is hurried by ``clock`` once the worker stops.

    After every (re)connection ``wake`` is set at once: jobs enqueued while nobody listened
    sent their NOTIFY to nobody, and only a claim finds them before the next poll.
    """
    failures = 0
    while not stopping.is_set():
        try:
            cargs, cparams = engine.dialect.create_connect_args(engine.url)
            cparams = {**CONNECT_ARGS, **cparams}
            with psycopg.connect(*cargs, **cparams, autocommit=True) as raw:
                raw.execute(sql.SQL("LISTEN {}").format(sql.Identifier(enqueue_sql.CHANNEL)))
                if failures:
                    log.info("listener reconnected")
                failures = 0
                wake.set()
                heard = time.monotonic()
                while not stopping.is_set():
                    for note in raw.notifies(timeout=0.5):
                        heard = time.monotonic()
                        if note.payload in queues:
                            wake.set()
                    if time.monotonic() - heard > LISTEN_PING:
                        # Silence may be a quiet queue or a network that forwards nothing:
                        # only an answer tells them apart. No answer in time drops the
                        # connection, and the loop connects afresh.
                        with DEADLINES.guard(raw, clock=clock):
                            raw.execute("SELECT 1")
                        heard = time.monotonic()
        except Exception as exc:
            if failures == 0:
                log.warning("listener connection lost (%s); reconnecting", one_line(exc))
            failures += 1
            stopping.wait(min(0.1 * 2**failures, RECONNECT_CAP))
