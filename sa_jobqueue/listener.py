"""The worker's LISTEN connection: wakes the claim loop when a job lands in one of its queues."""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection

import psycopg
from psycopg import sql
from sqlalchemy import Engine

from . import statements
from .database import CONNECT_ARGS
from .execution import one_line

log = logging.getLogger("sa_jobqueue.worker")

#: Longest wait before reconnecting after the LISTEN connection failed (seconds).
RECONNECT_CAP = 5.0


def listen(
    engine: Engine, queues: Collection[str], wake: threading.Event, stopping: threading.Event
) -> None:
    """Hold one LISTEN connection until ``stopping``; reconnect after any failure.

    After every (re)connection ``wake`` is set at once: jobs enqueued while nobody listened
    sent their NOTIFY to nobody, and only a claim finds them before the next poll.
    """
    failures = 0
    while not stopping.is_set():
        try:
            cargs, cparams = engine.dialect.create_connect_args(engine.url)
            cparams = {**CONNECT_ARGS, **cparams}
            with psycopg.connect(*cargs, **cparams, autocommit=True) as raw:
                raw.execute(sql.SQL("LISTEN {}").format(sql.Identifier(statements.CHANNEL)))
                if failures:
                    log.info("listener reconnected")
                failures = 0
                wake.set()
                while not stopping.is_set():
                    for note in raw.notifies(timeout=0.5):
                        if note.payload in queues:
                            wake.set()
        except Exception as exc:
            if failures == 0:
                log.warning("listener connection lost (%s); reconnecting", one_line(exc))
            failures += 1
            stopping.wait(min(0.1 * 2**failures, RECONNECT_CAP))
