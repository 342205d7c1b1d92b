"""sa_jobqueue: enqueue through a Session, workers through its CLI."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session

from bench.adapters.base import Kind, Producer, System, chunks, install_results_table

if TYPE_CHECKING:
    from sa_jobqueue import JobQueue


def _app(kind: Kind) -> tuple[str, JobQueue]:
    """The worker's application for a kind of handler, and its JobQueue: ``bench.tasks``, or
    for the ``async def`` handlers ``bench.async_tasks`` (a queue of their own: see there)."""
    if kind.endswith("_async"):
        from bench.async_tasks import queue as async_queue

        return "bench.async_tasks:queue", async_queue
    from bench.tasks import queue

    return "bench.tasks:queue", queue


class SaJobqueue(System):
    key = "sa_jobqueue"
    label = "sa_jobqueue"
    config = "sa-jobqueue worker --concurrency 10 (the CLI's default)"
    distribution = "sa_jobqueue"
    modules = ("sa_jobqueue",)
    peer = False
    pending_sql = (
        "SELECT (payload->>'n')::int FROM sa_jobqueue_jobs WHERE status IN ('queued', 'running')"
    )
    history_sql = """
        INSERT INTO sa_jobqueue_jobs
            (queue, task, payload, status, attempts, started_at, finished_at)
        SELECT 'bench', 'noop', jsonb_build_object('n', -g), 'succeeded', 1, now(), now()
        FROM generate_series(1, %(n)s) AS g
    """
    tables = ("sa_jobqueue_jobs",)

    #: Handler threads per worker process (the CLI's default).
    concurrency = 10

    def install(self, dsn: str) -> None:
        from sa_jobqueue.database import create_engine
        from sa_jobqueue.migrations import upgrade

        engine = create_engine(dsn)
        try:
            upgrade(engine)
        finally:
            engine.dispose()
        install_results_table(dsn)

    @contextmanager
    def producer(self, dsn: str, kind: Kind) -> Iterator[Producer]:
        from sa_jobqueue.database import create_engine

        _, queue = _app(kind)
        engine = create_engine(dsn)
        task = queue.get_task(kind)

        def enqueue(n: int) -> None:
            with Session(engine) as session, session.begin():
                queue.enqueue(session, task, {"n": n})

        try:
            yield enqueue
        finally:
            engine.dispose()

    def enqueue_bulk(
        self, dsn: str, keys: Sequence[int], kind: Kind, batch: int | None = None
    ) -> None:
        from sa_jobqueue.database import create_engine

        _, queue = _app(kind)
        engine = create_engine(dsn)
        try:
            with Session(engine) as session:
                for part in chunks(keys, batch):
                    with session.begin():
                        queue.enqueue_many(session, kind, [{"n": n} for n in part])
        finally:
            engine.dispose()

    def worker_argv(self, kind: Kind) -> list[str]:
        return [
            sys.executable,
            "-m",
            "sa_jobqueue",
            "--log-level",
            "WARNING",
            "worker",
            _app(kind)[0],
            "--concurrency",
            str(self.concurrency),
        ]
