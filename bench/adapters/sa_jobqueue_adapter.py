"""sa_jobqueue: enqueue through a Session, workers through its CLI."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from sqlalchemy.orm import Session

from bench.adapters.base import Kind, Producer, System, chunks, install_results_table


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
        from bench.tasks import queue
        from sa_jobqueue.database import create_engine

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
        from bench.tasks import queue
        from sa_jobqueue.database import create_engine

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
            "bench.tasks:queue",
            "--concurrency",
            str(self.concurrency),
        ]


class SaJobqueueProcesses(SaJobqueue):
    """One ``sa-jobqueue worker --processes N`` command: a supervisor and its N children."""

    label = "sa_jobqueue --processes"

    def __init__(self, processes: int = 2) -> None:
        self.processes = processes
        self.key = f"sa_jobqueue_processes{processes}"
        self.config = f"sa-jobqueue worker --processes {processes} --concurrency 10"
        # Each child runs its share of the warm-up, as separately started workers do.
        self.warmup_per_process = SaJobqueue.warmup_per_process * processes

    def worker_argv(self, kind: Kind) -> list[str]:
        return [*super().worker_argv(kind), "--processes", str(self.processes)]

    def all_up(self, watch: psycopg.Connection[Any], pids: list[int], procs: int) -> bool:
        """Every child has its row in the worker registry (it has started claiming)."""
        row = watch.execute(
            "SELECT count(*) FROM sa_jobqueue_workers WHERE pid = ANY(%s)", (pids,)
        ).fetchone()
        return row is not None and row[0] >= self.processes * procs
