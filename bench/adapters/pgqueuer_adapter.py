"""PgQueuer: its Queries and QueueManager on psycopg, at the defaults and at batch_size=100."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

import psycopg

from bench.adapters.base import (
    Kind,
    Producer,
    System,
    chunks,
    install_results_table,
    peer_worker_argv,
)
from bench.record import record


class PgQueuer(System):
    key = "pgqueuer"
    label = "pgqueuer"
    distribution = "pgqueuer"
    modules = ("pgqueuer",)
    # A finished job leaves the queue table for pgqueuer_log: what is left is unfinished.
    pending_sql = "SELECT convert_from(payload, 'UTF8')::int FROM pgqueuer"
    history_sql = """
        INSERT INTO pgqueuer_log (job_id, status, entrypoint, priority)
        SELECT g, 'successful', 'noop', 0 FROM generate_series(1, %(n)s) AS g
    """
    tables = ("pgqueuer", "pgqueuer_log", "pgqueuer_statistics")

    #: QueueManager.run(batch_size=...): None means its default.
    batch_size: ClassVar[int | None] = None

    def install(self, dsn: str) -> None:
        from pgqueuer import Queries

        async def install() -> None:
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                await Queries.from_psycopg_connection(conn).install()

        asyncio.run(install())
        install_results_table(dsn)

    @contextmanager
    def producer(self, dsn: str, kind: Kind) -> Iterator[Producer]:
        from pgqueuer import Queries

        with asyncio.Runner() as runner:
            conn = runner.run(psycopg.AsyncConnection.connect(dsn, autocommit=True))
            queries = Queries.from_psycopg_connection(conn)

            def enqueue(n: int) -> None:
                runner.run(queries.enqueue(kind, str(n).encode()))

            try:
                yield enqueue
            finally:
                runner.run(conn.close())

    def enqueue_bulk(
        self, dsn: str, keys: Sequence[int], kind: Kind, batch: int | None = None
    ) -> None:
        from pgqueuer import Queries

        async def enqueue() -> None:
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                queries = Queries.from_psycopg_connection(conn)
                # One statement, so one transaction (autocommit), per batch; for a preload, one
                # per 50,000 jobs (its arrays grow with the batch).
                for part in chunks(keys, batch or 50_000):
                    await queries.enqueue(
                        [kind] * len(part), [str(n).encode() for n in part], [0] * len(part)
                    )

        asyncio.run(enqueue())

    def worker_argv(self, kind: Kind) -> list[str]:
        return peer_worker_argv(self, kind)

    def run_worker(self, dsn: str, kind: Kind) -> None:
        asyncio.run(self._work(dsn, kind))

    async def _work(self, dsn: str, kind: Kind) -> None:
        from pgqueuer import Queries, QueueManager
        from psycopg_pool import AsyncConnectionPool

        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        pool = AsyncConnectionPool(dsn, kwargs={"autocommit": True}, max_size=10, open=False)
        await pool.open()
        manager = QueueManager(Queries.from_psycopg_connection(conn))

        @manager.entrypoint("noop")
        async def noop(job: Any) -> None:
            record(int(job.payload))

        @manager.entrypoint("write")
        async def write(job: Any) -> None:
            n = int(job.payload)
            record(n)
            # A connection of the handler's own: its own transaction, apart from the job's.
            async with pool.connection() as db:
                await db.execute("INSERT INTO bench_results (n) VALUES (%s)", (n,))

        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, manager.shutdown.set)
        try:
            if self.batch_size is None:
                await manager.run()
            else:
                await manager.run(batch_size=self.batch_size)
        finally:
            await pool.close()
            await conn.close()


class PgQueuerTuned(PgQueuer):
    key = "pgqueuer_b100"
    label = "pgqueuer (batch_size=100)"
    batch_size = 100
