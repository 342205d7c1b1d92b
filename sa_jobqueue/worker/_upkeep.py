"""Upkeep: the worker registry, periodic schedules and pruning; none of it runs jobs."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from .. import periodic
from .._error_text import one_line
from .._sql import retention as retention_sql
from ..ops import workers as presence
from ..queue import JobQueue
from ._heartbeat import HEARTBEAT_TICK
from ._history import HistoryFolder

log = logging.getLogger("sa_jobqueue.worker")

#: Seconds between pruning rounds, and folds of the history (with a retention above zero).
PRUNE_INTERVAL = 60.0
#: Rows one pruning statement deletes at most; a round runs at most PRUNE_MAX_BATCHES of them,
#: so a long backlog of history is worked off over several rounds, never in one long lock.
PRUNE_BATCH = 1_000
PRUNE_MAX_BATCHES = 10
#: How often a worker refreshes its row in the worker registry (seconds), and after how long
#: without a refresh a row is taken for a dead worker's and deleted by any live worker.
PRESENCE_INTERVAL = 10.0
WORKER_STALE = timedelta(minutes=1)
#: How often periodic schedules are looked at (seconds): how late after its tick a periodic
#: job is enqueued, at most.
PERIODIC_INTERVAL = 1.0


class Pruner:
    """Deletes finished jobs past their retention, in bounded batches, one worker at a time;
    folds the finishes into the hourly history first (with any retention, ``None`` too)."""

    def __init__(
        self, engine: Engine, retention: timedelta | None, poll_interval: timedelta
    ) -> None:
        self._engine = engine
        self.retention = retention
        self._poll_interval = poll_interval
        self._history = HistoryFolder(engine)

    def round(self) -> float:
        """Fold the history and prune; a failure is logged and tried again at the next round.
        Returns when the next round is due (``time.monotonic()``): its caller, the claim
        loop, calls again only then."""
        # Every minute, or at every poll when finished jobs are to go at once; jittered so
        # workers started together do not all try at the same moment.
        at_once = self.retention == timedelta(0)
        interval = self._poll_interval.total_seconds() if at_once else PRUNE_INTERVAL
        next_round = time.monotonic() + interval * random.uniform(0.8, 1.2)
        try:
            self._history.fold()
            self._history.prune()
        except SQLAlchemyError as exc:
            log.warning("folding the history failed: %s", one_line(exc))
        try:
            deleted = self.prune()
        except SQLAlchemyError as exc:
            log.warning("pruning failed: %s", one_line(exc))
            return next_round
        if deleted:
            log.info("pruned %d finished job(s)", deleted)
        return next_round

    def prune(self, *, max_batches: int = PRUNE_MAX_BATCHES) -> int:
        """Delete succeeded and cancelled jobs older than ``retention``, and counts of starts
        per key of windows that are over; return how many jobs.

        Runs in bounded batches of PRUNE_BATCH rows, each its own short transaction, and only
        while this worker holds the prune advisory lock, so two workers never prune at once.
        Returns 0 without waiting when another session holds the lock.
        """
        if self.retention is None:
            return 0
        params = {"retention": self.retention.total_seconds(), "limit": PRUNE_BATCH}
        total = 0
        for _ in range(max_batches):
            with self._engine.begin() as conn:
                if not conn.execute(retention_sql.try_prune_lock()).scalar():
                    return total
                deleted: int = conn.execute(retention_sql.prune(), params).scalar_one()
            total += deleted
            if deleted < PRUNE_BATCH:
                break
        # The counts of starts per key whose window is over go with them, and the settled
        # edges of workflows whose waiting jobs are gone (neither counted).
        with self._engine.begin() as conn:
            if conn.execute(retention_sql.try_prune_lock()).scalar():
                conn.execute(retention_sql.prune_key_starts(), {"limit": PRUNE_BATCH})
                conn.execute(retention_sql.prune_edges(), {"limit": PRUNE_BATCH})
        return total


class Upkeep:
    """Keeps this worker's registry row fresh and enqueues periodic jobs as they fall due.

    Neither is needed to run jobs: a failure is logged (once until it works again) and
    retried at the next round. Periodic jobs stop with claiming (``stopping``); the registry
    row stays until the last job has finished or been given up (``halt``).
    """

    def __init__(
        self,
        queue: JobQueue,
        single: Engine,
        *,
        name: str,
        queues: list[str],
        concurrency: int,
        wake: threading.Event,
        stopping: threading.Event,
        halt: threading.Event,
    ) -> None:
        self._queue = queue
        self._single = single
        self._name = name
        self._queues = queues
        self._concurrency = concurrency
        self._wake = wake
        self._stopping = stopping
        self._halt = halt

    def loop(self) -> None:
        """Until ``halt``: periodic schedules about every second, presence every ten."""
        next_presence = next_periodic = 0.0
        failing: set[str] = set()
        while True:
            now = time.monotonic()
            if self._queue.schedules and not self._stopping.is_set() and now >= next_periodic:
                next_periodic = now + PERIODIC_INTERVAL * random.uniform(0.9, 1.1)
                with _step("periodic schedules", failing):
                    if periodic.enqueue_due(self._single, self._queue):
                        self._wake.set()
            if now >= next_presence:
                next_presence = now + PRESENCE_INTERVAL
                with _step("worker registry", failing):
                    self._be_present()
            if self._halt.wait(HEARTBEAT_TICK * 2.5):
                break
        with _step("worker registry", failing), self._single.connect() as conn:
            presence.unregister_worker(conn, self._name)

    def _be_present(self) -> None:
        with self._single.connect() as conn:
            if not presence.touch_worker(conn, self._name):
                host, pid = socket.gethostname(), os.getpid()
                presence.register_worker(
                    conn, self._name, host, pid, self._queues, self._concurrency
                )
            presence.expire_workers(conn, WORKER_STALE)


@contextlib.contextmanager
def _step(what: str, failing: set[str]) -> Iterator[None]:
    try:
        yield
    except Exception as exc:  # the database, or a task's unique_key function
        if what not in failing:
            log.warning("%s: %s; retrying", what, one_line(exc))
        failing.add(what)
    else:
        if what in failing:
            log.info("%s: working again", what)
        failing.discard(what)
