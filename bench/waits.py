"""What the server's backends are doing during a drain: sampled wait events and blockers.

A :class:`WaitSampler` reads ``pg_stat_activity`` every :data:`INTERVAL` seconds on a
connection of its own, for the active client backends of the drain's database, and counts per
statement (a short label of its text) how often it was on the CPU or waiting, on what; for a
backend waiting on a heavyweight lock, which statement holds it (``pg_blocking_pids()``). The
result is the average number of backends in each state per sample: 3.2 means that, at any
moment, about three backends were there.

Where the server has ``pg_stat_statements`` (loaded, and the extension in the drain's
database), the sampler also reads each statement's calls, rows and execution time over the
same window: how many claims, completions and commits a job cost at each process count.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from typing import Any

import psycopg

#: Seconds between samples.
INTERVAL = 0.02
#: Blockers are asked for in one sample of this many: ``pg_blocking_pids()`` takes every
#: partition lock of the lock manager, and asked of every waiting backend every 20 ms it
#: made the lock manager a wait of its own (``LWLock:LockManager``).
BLOCKERS_EVERY = 10

#: The active client backends of this database but the sampler's own, with what blocks each
#: backend that waits on a heavyweight lock (pg_blocking_pids takes the lock manager's locks:
#: asked only of those).
SAMPLE = """
SELECT a.query, a.wait_event_type, a.wait_event,
       CASE WHEN a.wait_event_type = 'Lock' AND %(blockers)s THEN
           (SELECT b.query FROM pg_stat_activity b
            WHERE b.pid = (pg_blocking_pids(a.pid))[1])
       END
FROM pg_stat_activity a
WHERE a.datname = current_database() AND a.backend_type = 'client backend'
  AND a.state = 'active' AND a.pid <> pg_backend_pid()
"""


#: Each statement of this database as ``pg_stat_statements`` counts it so far.
STATEMENTS = """
SELECT s.queryid, s.query, s.calls, s.rows, s.total_exec_time
FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
WHERE d.datname = current_database()
"""


def label(query: str | None) -> str:
    """A statement's label: its first words, whitespace collapsed, at most 48 characters."""
    if not query:
        return "(none)"
    return re.sub(r"\s+", " ", query).strip()[:48]


class WaitSampler:
    """Samples the drain's backends in a thread, from :meth:`start` to :meth:`close`."""

    def __init__(self, dsn: str) -> None:
        self._conn = psycopg.connect(dsn, autocommit=True)
        self.pid = self._conn.info.backend_pid
        self.samples = 0
        self.blocker_samples = 0  # the samples that asked for blockers
        self.states: Counter[tuple[str, str]] = Counter()
        self.blockers: Counter[tuple[str, str]] = Counter()
        self._counted_at_start: dict[int, tuple[str, int, int, float]] | None = None
        self.statements: list[list[Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wait-sampler", daemon=True)

    def start(self) -> None:
        self._counted_at_start = self._statements()
        self._thread.start()

    def close(self) -> None:
        """Stop sampling (if started), read the statements' counts and close the connection;
        again: nothing."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        if self._conn.closed:
            return
        if self._counted_at_start is not None and self._thread.ident is not None:
            self.statements = self._statements_since(self._counted_at_start)
        self._conn.close()

    def _statements(self) -> dict[int, tuple[str, int, int, float]] | None:
        """Each statement's (text, calls, rows, milliseconds) so far; None without
        ``pg_stat_statements``."""
        try:
            rows = self._conn.execute(STATEMENTS).fetchall()
        except psycopg.Error:
            return None
        return {qid: (query, calls, n, ms) for qid, query, calls, n, ms in rows}

    def _statements_since(self, before: dict[int, tuple[str, int, int, float]]) -> list[list[Any]]:
        """[label, calls, rows, milliseconds] of each statement run since ``before``, the most
        called first (statements of the same label summed)."""
        now = self._statements() or {}
        summed: dict[str, list[Any]] = {}
        for qid, (query, calls, n, ms) in now.items():
            _, calls0, n0, ms0 = before.get(qid, ("", 0, 0, 0.0))
            if calls == calls0:
                continue
            entry = summed.setdefault(label(query), [label(query), 0, 0, 0.0])
            entry[1] += calls - calls0
            entry[2] += n - n0
            entry[3] = round(entry[3] + ms - ms0, 1)
        return sorted(summed.values(), key=lambda e: -e[1])

    def _run(self) -> None:
        while not self._stop.wait(INTERVAL):
            blockers = self.samples % BLOCKERS_EVERY == 0
            try:
                rows = self._conn.execute(SAMPLE, {"blockers": blockers}).fetchall()
            except psycopg.Error:
                return
            self.samples += 1
            self.blocker_samples += blockers
            for query, kind, event, blocker in rows:
                statement = label(query)
                self.states[(statement, "CPU" if kind is None else f"{kind}:{event}")] += 1
                if kind == "Lock" and blockers:
                    held = label(blocker) if blocker else "(ended before it was read)"
                    self.blockers[(statement, held)] += 1

    def as_dict(self) -> dict[str, Any]:
        """Average backends per sample in each (statement, state), and each (waiting
        statement, blocking statement), the largest first."""

        def averaged(counts: Counter[tuple[str, str]], n: int) -> list[list[Any]]:
            return [[a, b, round(c / max(n, 1), 3)] for (a, b), c in counts.most_common()]

        return {
            "samples": self.samples,
            "interval": INTERVAL,
            "blocker_samples": self.blocker_samples,
            "states": averaged(self.states, self.samples),
            "blocked_by": averaged(self.blockers, self.blocker_samples),
            "statements": self.statements,
        }
