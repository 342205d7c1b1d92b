"""Chancy: its migrate, queue declaration, push/push_many and Worker.

Two configurations: the defaults (a queue declared with no options: the process-pool
executor, its concurrency the core count, 5 s polling; the worker writes job updates every
second) and a tuned one, from the options its Queue and Worker document: the asyncio
executor (for many short I/O-bound jobs), 50 jobs at once, eager polling (poll again as soon
as a job completes), and job updates written every 0.1 s (``Worker.send_outgoing_interval``).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

from bench.adapters.base import (
    QUEUE,
    Kind,
    Producer,
    System,
    install_results_table,
    peer_worker_argv,
)
from bench.record import record

_log = logging.getLogger("bench.chancy")
_log.setLevel(logging.WARNING)
_pool: Any = None
_conn: Any = None


def noop_sync(n: int) -> None:
    """The no-op handler for the process-pool executor (it runs plain functions)."""
    record(n)


def write_sync(n: int) -> None:
    """The writing handler for the process-pool executor: a connection per pool process."""
    global _conn
    record(n)
    if _conn is None:
        import psycopg

        _conn = psycopg.connect(os.environ["BENCH_DSN"], autocommit=True)
    # Its own transaction, apart from the job's completion.
    _conn.execute("INSERT INTO bench_results (n) VALUES (%s)", (n,))


async def noop(n: int) -> None:
    record(n)


async def write(n: int) -> None:
    global _pool
    record(n)
    if _pool is None:
        from psycopg_pool import AsyncConnectionPool

        _pool = AsyncConnectionPool(
            os.environ["BENCH_DSN"], kwargs={"autocommit": True}, max_size=10, open=False
        )
        await _pool.open()
    # A connection of the handler's own: its own transaction, apart from the job's.
    async with _pool.connection() as db:
        await db.execute("INSERT INTO bench_results (n) VALUES (%s)", (n,))


_FUNCS: dict[str, str] = {
    "noop_sync": f"{__name__}.noop_sync",
    "write_sync": f"{__name__}.write_sync",
    "noop": f"{__name__}.noop",
    "write": f"{__name__}.write",
}


class Chancy(System):
    key = "chancy"
    label = "chancy (defaults)"
    config = "Worker(app), Queue(name) at its defaults: ProcessExecutor, polling every 5 s"
    distribution = "chancy"
    modules = ("chancy",)
    pending_sql = (
        "SELECT (kwargs->>'n')::int FROM chancy_jobs"
        " WHERE state IN ('pending', 'running', 'retrying')"
    )
    history_sql = (
        "INSERT INTO chancy_jobs"
        " (id, queue, func, kwargs, state, attempts, started_at, completed_at)"
        " SELECT gen_random_uuid(), 'bench', 'bench.adapters.chancy_adapter.noop',"
        " json_build_object('n', -g), 'succeeded', 1, now(), now()"
        " FROM generate_series(1, %(n)s) AS g"
    )
    tables = ("chancy_jobs",)
    #: Queue options beyond the name (none: Chancy's defaults).
    queue_options: ClassVar[dict[str, Any]] = {}
    # Its defaults run a few jobs a second (2 at a time, polling every 5 s): a short warm-up.
    warmup_per_process: ClassVar[int] = 4
    #: Worker.send_outgoing_interval (None: its default, 1 s).
    outgoing_interval: ClassVar[float | None] = None

    def _func(self, kind: Kind) -> str:
        if not self.queue_options:  # the process-pool executor: plain functions
            return _FUNCS[f"{kind}_sync"]
        return _FUNCS[kind]

    def install(self, dsn: str) -> None:
        from chancy import Chancy as App
        from chancy import Queue

        async def install() -> None:
            async with App(dsn, log=_log) as app:
                await app.migrate()
                await app.declare(Queue(name=QUEUE, **self.queue_options), upsert=True)

        asyncio.run(install())
        install_results_table(dsn)

    def _job(self, kind: Kind, n: int) -> Any:
        from chancy import Job

        return Job(func=self._func(kind), queue=QUEUE, kwargs={"n": n})

    @contextmanager
    def producer(self, dsn: str, kind: Kind) -> Iterator[Producer]:
        from chancy import Chancy as App

        with asyncio.Runner() as runner:
            app = App(dsn, log=_log)
            runner.run(app.__aenter__())

            def enqueue(n: int) -> None:
                runner.run(app.push(self._job(kind, n)))

            try:
                yield enqueue
            finally:
                runner.run(app.__aexit__(None, None, None))

    def enqueue_bulk(
        self, dsn: str, keys: Sequence[int], kind: Kind, batch: int | None = None
    ) -> None:
        from chancy import Chancy as App

        async def push() -> None:
            async with App(dsn, log=_log) as app:
                # It yields the references of each batch as that batch commits.
                jobs = [self._job(kind, n) for n in keys]
                async for _ in app.push_many(jobs, batch_size=batch or 1000):
                    pass

        asyncio.run(push())

    def worker_argv(self, kind: Kind) -> list[str]:
        return peer_worker_argv(self, kind)

    def run_worker(self, dsn: str, kind: Kind) -> None:
        from chancy import Chancy as App
        from chancy import Worker

        async def work() -> None:
            async with App(dsn, log=_log) as app:
                worker = Worker(app)
                if self.outgoing_interval is not None:
                    worker.send_outgoing_interval = self.outgoing_interval
                async with worker:
                    await worker.wait_for_shutdown()  # it handles SIGTERM itself

        asyncio.run(work())


class ChancyTuned(Chancy):
    key = "chancy_tuned"
    label = "chancy (tuned)"
    config = (
        "Queue(concurrency=50, executor=AsyncExecutor, polling_interval=1,"
        " eager_polling=True), Worker.send_outgoing_interval=0.1"
    )
    outgoing_interval = 0.1
    warmup_per_process = 50
    queue_options: ClassVar[dict[str, Any]] = {
        "concurrency": 50,
        "executor": "chancy.executors.asyncex.AsyncExecutor",
        "polling_interval": 1,
        "eager_polling": True,
    }
