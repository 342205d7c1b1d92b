"""PgQueuer: workers run as its CLI (``pgq run``) runs them, on an asyncpg connection.

PgQueuer's README and its Quick Start build the consumer on one asyncpg connection
(``AsyncpgDriver``) and run it with ``pgq run module:factory``, which runs the event loop on
uvloop (a dependency of PgQueuer); the workers here call ``pgqueuer.run``, what
``pgq run`` calls, on uvloop. Its performance guide says to raise ``batch_size`` for
short jobs, to run ``pgq autovac`` after installing, and to keep a direct asyncpg
connection (not a pool) for the consumer; its benchmark page measures asyncpg at about 1.7x
psycopg. Four configurations:

- ``pgqueuer``: the defaults (``batch_size=10``);
- ``pgqueuer_b100`` and ``pgqueuer_b500``: ``batch_size`` 100 (what an independent harness
  ran) and 500 (the best of 100, 200, 500, 1,000 and 2,000 in a sweep of no-op drains: larger
  ones gained nothing), with ``pgq autovac``: the tuning its guide documents that keeps every
  job durable (the ``balanced`` and ``volatile`` durability modes lose jobs on a crash, so
  they are not compared);
- ``pgqueuer_psycopg``: ``batch_size=100`` on one psycopg ``AsyncConnection``, the
  configuration earlier versions of this benchmark ran (only with ``--systems``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
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

INSERT_RESULT = "INSERT INTO bench_results (n) VALUES ($1)"


def _dsn() -> str:
    return os.environ["BENCH_DSN"]


@asynccontextmanager
async def _consumer(kind: Kind, driver: str) -> AsyncIterator[Any]:
    """What ``pgq run`` runs: a QueueManager on one connection, its handlers registered.

    A QueueManager rather than a ``PgQueuer`` (its docs allow either): the benchmark has no
    schedules, and ``PgQueuer`` would also run the scheduler's polling loop.
    """
    import asyncpg
    from pgqueuer import Queries, QueueManager

    if driver == "asyncpg":
        conn: Any = await asyncpg.connect(dsn=_dsn())
        manager = QueueManager(Queries.from_asyncpg_connection(conn))
    else:
        conn = await psycopg.AsyncConnection.connect(_dsn(), autocommit=True)
        manager = QueueManager(Queries.from_psycopg_connection(conn))
    # A writing handler's pool, made once per process (PgQueuer's "shared resources" guide).
    pool = None
    if kind == "write":
        pool = await asyncpg.create_pool(dsn=_dsn(), min_size=1, max_size=10)

    @manager.entrypoint(kind)
    async def handle(job: Any) -> None:
        n = int(job.payload)
        record(n)
        if pool is not None:
            # Its own transaction, apart from the job's completion (which PgQueuer batches).
            await pool.execute(INSERT_RESULT, n)

    try:
        yield manager
    finally:
        if pool is not None:
            await pool.close()
        await conn.close()


# The factories, one per driver and handler kind (``pgq run`` takes them by import path).
def asyncpg_noop() -> Any:
    return _consumer("noop", "asyncpg")


def asyncpg_write() -> Any:
    return _consumer("write", "asyncpg")


def psycopg_noop() -> Any:
    return _consumer("noop", "psycopg")


def psycopg_write() -> Any:
    return _consumer("write", "psycopg")


class PgQueuer(System):
    key = "pgqueuer"
    label = "pgqueuer"
    config = "pgqueuer.run on uvloop, one asyncpg connection, batch_size=10 (defaults)"
    distribution = "pgqueuer"
    modules = ("pgqueuer", "asyncpg")
    # A finished job leaves the queue table for pgqueuer_log: what is left is unfinished.
    pending_sql = "SELECT convert_from(payload, 'UTF8')::int FROM pgqueuer"
    history_sql = """
        INSERT INTO pgqueuer_log (job_id, status, entrypoint, priority)
        SELECT g, 'successful', 'noop', 0 FROM generate_series(1, %(n)s) AS g
    """
    tables = ("pgqueuer", "pgqueuer_log", "pgqueuer_statistics")

    #: ``pgq run --batch-size``.
    batch_size: ClassVar[int] = 10
    #: The consumer's connection: ``asyncpg`` (documented) or ``psycopg``.
    driver: ClassVar[str] = "asyncpg"
    #: Apply ``pgq autovac`` (its tuned autovacuum settings and fillfactor 70) after installing.
    autovac: ClassVar[bool] = False

    def install(self, dsn: str) -> None:
        from pgqueuer import Queries
        from pgqueuer.db import AsyncpgDriver

        async def install() -> None:
            import asyncpg

            conn = await asyncpg.connect(dsn=dsn)
            try:
                queries = Queries(AsyncpgDriver(conn))
                await queries.install()
                if self.autovac:
                    await queries.optimize_autovacuum()
            finally:
                await conn.close()

        asyncio.run(install())
        install_results_table(dsn)

    @contextmanager
    def producer(self, dsn: str, kind: Kind) -> Iterator[Producer]:
        import asyncpg
        from pgqueuer import Queries
        from pgqueuer.db import AsyncpgDriver

        with asyncio.Runner() as runner:
            conn = runner.run(asyncpg.connect(dsn=dsn))
            queries = Queries(AsyncpgDriver(conn))

            def enqueue(n: int) -> None:
                runner.run(queries.enqueue(kind, str(n).encode()))

            try:
                yield enqueue
            finally:
                runner.run(conn.close())

    def enqueue_bulk(
        self, dsn: str, keys: Sequence[int], kind: Kind, batch: int | None = None
    ) -> None:
        import asyncpg
        from pgqueuer import Queries
        from pgqueuer.db import AsyncpgDriver

        async def enqueue() -> None:
            conn = await asyncpg.connect(dsn=dsn)
            try:
                queries = Queries(AsyncpgDriver(conn))
                # One statement, so one transaction (autocommit), per batch; for a preload, one
                # per 50,000 jobs (its arrays grow with the batch).
                for part in chunks(keys, batch or 50_000):
                    await queries.enqueue(
                        [kind] * len(part), [str(n).encode() for n in part], [0] * len(part)
                    )
            finally:
                await conn.close()

        asyncio.run(enqueue())

    def worker_argv(self, kind: Kind) -> list[str]:
        return peer_worker_argv(self, kind)

    def run_worker(self, dsn: str, kind: Kind) -> None:
        # What `pgq run FACTORY --batch-size N` does, without its CLI (whose --log-level
        # option fails in this version, default included): pgqueuer.run, which handles
        # SIGTERM, on uvloop as the CLI runs it.
        import pgqueuer
        import uvloop

        factory = {"noop": asyncpg_noop, "write": asyncpg_write}
        if self.driver == "psycopg":
            factory = {"noop": psycopg_noop, "write": psycopg_write}
        uvloop.run(pgqueuer.run(factory[kind], batch_size=self.batch_size))


class PgQueuerTuned(PgQueuer):
    key = "pgqueuer_b100"
    label = "pgqueuer (batch_size=100)"
    config = "pgqueuer.run on uvloop, one asyncpg connection, batch_size=100, pgq autovac"
    batch_size = 100
    autovac = True


class PgQueuerB500(PgQueuer):
    key = "pgqueuer_b500"
    label = "pgqueuer (batch_size=500)"
    config = "pgqueuer.run on uvloop, one asyncpg connection, batch_size=500, pgq autovac"
    batch_size = 500
    autovac = True


class PgQueuerPsycopg(PgQueuer):
    key = "pgqueuer_psycopg"
    label = "pgqueuer (psycopg, batch_size=100)"
    config = "pgqueuer.run on uvloop, one psycopg AsyncConnection, batch_size=100"
    batch_size = 100
    driver = "psycopg"
