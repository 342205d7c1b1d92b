"""procrastinate: its App and tasks, its schema applier, its worker API.

Two configurations: the defaults (``concurrency=1``, the connector's pool at psycopg_pool's
default of 4 connections, LISTEN/NOTIFY on) and ``procrastinate_c10``: ``concurrency=10``
with a pool of 10 connections, as its docs advise for short async jobs ("Execute multiple
jobs at the same time": sub-workers for async tasks; "Mind the size of your PostgreSQL
pool": as many connections as the concurrency, the listener's apart).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

from bench.adapters.base import (
    QUEUE,
    Kind,
    Producer,
    System,
    chunks,
    install_results_table,
    peer_worker_argv,
)
from bench.record import record


def make_app(dsn: str, pool_size: int | None = None) -> Any:
    import procrastinate

    pool = {} if pool_size is None else {"min_size": pool_size, "max_size": pool_size}
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn, **pool))

    @app.task(name="noop", queue=QUEUE)
    async def noop(n: int) -> None:
        record(n)

    @app.task(name="write", queue=QUEUE, pass_context=True)
    async def write(context: Any, n: int) -> None:
        record(n)
        # On the app's pool, autocommit: its own transaction, apart from the job's completion.
        await context.app.connector.execute_query_async(
            "INSERT INTO bench_results (n) VALUES (%(n)s)", n=n
        )

    return app


class Procrastinate(System):
    key = "procrastinate"
    label = "procrastinate"
    config = "App.run_worker(), concurrency=1, pool of 4 (defaults)"
    distribution = "procrastinate"
    modules = ("procrastinate",)
    pending_sql = (
        "SELECT (args->>'n')::int FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"
    )
    history_sql = """
        INSERT INTO procrastinate_jobs (queue_name, task_name, args, status, attempts)
        SELECT 'bench', 'noop', jsonb_build_object('n', -g), 'succeeded', 1
        FROM generate_series(1, %(n)s) AS g
    """
    tables = ("procrastinate_jobs", "procrastinate_events", "procrastinate_workers")
    #: run_worker(concurrency=...) and the connector's pool size (None: the defaults).
    concurrency: ClassVar[int | None] = None
    pool_size: ClassVar[int | None] = None

    def install(self, dsn: str) -> None:
        async def apply() -> None:
            app = make_app(dsn)
            async with app.open_async():
                await app.schema_manager.apply_schema_async()

        asyncio.run(apply())
        install_results_table(dsn)

    def reset(self, dsn: str) -> None:
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"TRUNCATE {', '.join(self.tables)}, bench_results CASCADE")

    @contextmanager
    def producer(self, dsn: str, kind: Kind) -> Iterator[Producer]:
        app = make_app(dsn)
        with asyncio.Runner() as runner:
            runner.run(app.connector.open_async())
            task = app.tasks[kind]

            def enqueue(n: int) -> None:
                runner.run(task.defer_async(n=n))

            try:
                yield enqueue
            finally:
                runner.run(app.close_async())

    def enqueue_bulk(
        self, dsn: str, keys: Sequence[int], kind: Kind, batch: int | None = None
    ) -> None:
        async def defer() -> None:
            app = make_app(dsn)
            async with app.open_async():
                for part in chunks(keys, batch):
                    await app.tasks[kind].batch_defer_async(*({"n": n} for n in part))

        asyncio.run(defer())

    def worker_argv(self, kind: Kind) -> list[str]:
        return peer_worker_argv(self, kind)

    def run_worker(self, dsn: str, kind: Kind) -> None:
        # LISTEN/NOTIFY on (the default); SIGTERM stops it gracefully.
        options = {} if self.concurrency is None else {"concurrency": self.concurrency}
        make_app(dsn, self.pool_size).run_worker(queues=[QUEUE], **options)


class ProcrastinateTuned(Procrastinate):
    key = "procrastinate_c10"
    label = "procrastinate (concurrency=10)"
    config = "App.run_worker(concurrency=10), pool of 10"
    concurrency = 10
    pool_size = 10
