"""What every benchmark handler does: note its job's key and the time it started.

A handler appends one line ``<key> <unix time>`` to a file of its own process under
``$BENCH_RECORD_DIR``. One unbuffered ``O_APPEND`` write per job: nothing is lost if a worker
is killed, it works in any process model (threads, asyncio, a process pool), and it costs the
same for every system. The harness reads the files back to check that every job ran exactly
once, to find when the first job started, and (idle latency) when each one did.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

RECORD_DIR_ENV = "BENCH_RECORD_DIR"

_fd: int | None = None
_pid: int | None = None


def record(key: int) -> None:
    """Note that the job with ``key`` started now (called first thing by every handler)."""
    global _fd, _pid
    if _fd is None or _pid != os.getpid():  # a forked child writes a file of its own
        directory = os.environ[RECORD_DIR_ENV]
        _pid = os.getpid()
        _fd = os.open(
            os.path.join(directory, f"{_pid}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644
        )
    os.write(_fd, f"{key} {time.time():.6f}\n".encode())


@dataclass
class Records:
    """Every handler start noted under one directory."""

    runs: Counter[int] = field(default_factory=Counter)
    started: dict[int, float] = field(default_factory=dict)  # key -> first start

    @property
    def first(self) -> float | None:
        return min(self.started.values(), default=None)

    @classmethod
    def read(cls, directory: Path) -> Records:
        records = cls()
        for path in directory.glob("*.log"):
            for line in path.read_text().splitlines():
                key_text, _, at_text = line.partition(" ")
                if not at_text:
                    continue  # a line cut short by a kill
                key, at = int(key_text), float(at_text)
                records.runs[key] += 1
                records.started[key] = min(at, records.started.get(key, at))
        return records


class Tail:
    """Reads the record files under a directory as they grow, each byte once."""

    def __init__(self, directory: Path, keys: range):
        self.directory = directory
        self.keys = keys
        self.records = Records()
        #: How many keys of ``keys`` have started at least once.
        self.started = 0
        #: When the first of ``keys`` started (the others' lines are read, not timed).
        self.first: float | None = None
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}

    def update(self) -> Records:
        for path in self.directory.glob("*.log"):
            offset = self._offsets.get(path, 0)
            with path.open("rb") as f:
                f.seek(offset)
                data = f.read()
            if not data:
                continue
            self._offsets[path] = offset + len(data)
            data = self._partial.pop(path, b"") + data
            complete, _, rest = data.rpartition(b"\n")
            if rest:
                self._partial[path] = rest  # a line still being written
            for line in complete.split(b"\n"):
                key_text, _, at_text = line.partition(b" ")
                if not at_text:
                    continue
                key, at = int(key_text), float(at_text)
                if key in self.keys:
                    if key not in self.records.runs:
                        self.started += 1
                    self.first = at if self.first is None else min(self.first, at)
                self.records.runs[key] += 1
                self.records.started[key] = min(at, self.records.started.get(key, at))
        return self.records
