"""procrastinate: its App and tasks, its schema applier, its worker API at the defaults."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

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


def make_app(dsn: str) -> Any:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

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
        # The defaults: concurrency 1, LISTEN/NOTIFY on, SIGTERM stops it gracefully.
        make_app(dsn).run_worker(queues=[QUEUE])
