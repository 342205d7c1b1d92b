"""The interface every system under test implements, and helpers they share."""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar, Literal

import psycopg

#: What a drain's handlers do: nothing, write one row each, or (``batch_write``) write one row
#: per job with one multi-row INSERT per batch, where the system has batch handlers (the others
#: run it as ``write``); sa_jobqueue's handlers also wait a millisecond (``sleep_1ms``), and
#: have ``async def`` twins of the first three (``*_async``, the async scenario's: see
#: ``bench.async_tasks``), which no peer runs.
Kind = Literal[
    "noop", "write", "batch_write", "sleep_1ms", "noop_async", "write_async", "sleep_1ms_async"
]  # fmt: skip
#: The kinds whose handler writes one row per job (the harness checks each row is there once).
WRITING: tuple[Kind, ...] = ("write", "batch_write", "write_async")
#: The table a writing handler inserts its key into (one per database).
RESULTS_DDL = "CREATE TABLE IF NOT EXISTS bench_results (n integer NOT NULL)"
#: The queue (or queue-like name) every system's benchmark jobs go to.
QUEUE = "bench"

Producer = Callable[[int], None]


class System(ABC):
    """A job queue under test, with one configuration (defaults, or a named tuning)."""

    #: Short identifier, used for database names and on the command line.
    key: ClassVar[str]
    #: How the tables show it.
    label: ClassVar[str]
    #: The configuration, in a line, as the report's header states it.
    config: ClassVar[str] = ""
    #: The distribution whose version is reported (None: not a package).
    distribution: ClassVar[str | None] = None
    #: Modules that must import for the system to run.
    modules: ClassVar[tuple[str, ...]] = ()
    #: True for the peers sa_jobqueue is compared with (ratios are to the best of them).
    peer: ClassVar[bool] = True
    #: SELECT returning the key of every job not finished yet (queued or running).
    pending_sql: ClassVar[str]
    #: INSERT of ``%(n)s`` finished jobs (keys -1, -2, ...) in the system's own table(s).
    history_sql: ClassVar[str]
    #: Tables emptied between repetitions.
    tables: ClassVar[tuple[str, ...]]
    #: Untimed jobs per worker process before each drain (a slow system gets fewer).
    warmup_per_process: ClassVar[int] = 50

    def unavailable(self) -> str | None:
        """Why this system cannot run here, or None."""
        for module in self.modules:
            try:
                importlib.import_module(module)
            except Exception as exc:
                return f"{module} does not import ({type(exc).__name__}: {exc})"
        return None

    def version(self) -> str:
        if self.distribution is None:
            return "-"
        try:
            return importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    @abstractmethod
    def install(self, dsn: str) -> None:
        """Create the system's schema in an empty database, its documented way."""

    def all_up(self, watch: psycopg.Connection[Any], pids: list[int], procs: int) -> bool:
        """Whether every worker process of ``procs`` commands (``pids``: their trees) is up.

        The harness counts connections too; a system whose one command starts several worker
        processes says here when they all are, so that no drain starts with one still starting.
        """
        return True

    def reset(self, dsn: str) -> None:
        """Empty the job tables and the results table (between repetitions)."""
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"TRUNCATE {', '.join((*self.tables, 'bench_results'))}")

    @abstractmethod
    def producer(self, dsn: str, kind: Kind) -> AbstractContextManager[Producer]:
        """A function that enqueues one job with a key and commits, as an app would."""

    @abstractmethod
    def enqueue_bulk(
        self, dsn: str, keys: Sequence[int], kind: Kind, batch: int | None = None
    ) -> None:
        """Enqueue one job per key through the system's batch API, ``batch`` per transaction.

        ``batch`` None (the drains' preload) leaves the batching to the adapter: all in one
        transaction where the system can, else its own default.
        """

    @abstractmethod
    def worker_argv(self, kind: Kind) -> list[str]:
        """The command that runs one worker process (database URL in $BENCH_DSN)."""


def peer_worker_argv(system: System, kind: Kind) -> list[str]:
    """A worker process started through ``bench.peer_worker`` (our runner of a peer's API)."""
    return [sys.executable, "-m", "bench.peer_worker", system.key, kind]


def install_results_table(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(RESULTS_DDL)


def chunks(keys: Sequence[int], size: int | None) -> Iterator[Sequence[int]]:
    """``keys`` in slices of ``size`` (None: all in one)."""
    step = size or max(len(keys), 1)
    for start in range(0, len(keys), step):
        yield keys[start : start + step]
