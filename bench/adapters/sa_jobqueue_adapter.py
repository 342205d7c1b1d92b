"""sa_jobqueue: enqueue through a Session, workers through its CLI."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import psycopg
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
    #: Enqueue options every job of the benchmark is given (none: the plain enqueue).
    options: dict[str, Any] = {}

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
                queue.enqueue(session, task, {"n": n}, **self.options)

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
                        payloads = [{"n": n} for n in part]
                        queue.enqueue_many(session, kind, payloads, **self.options)
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


class SaJobqueueConcurrency(SaJobqueue):
    """The CLI's worker with fewer handler threads than its default.

    For jobs that are short and mostly talk to PostgreSQL, handler threads beyond what the
    machine's cores can keep busy cost more than they give: they take turns at Python's
    GIL, a context switch each time, and their connections contend inside the server.
    """

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self.key = f"sa_jobqueue_c{concurrency}"
        self.label = f"sa_jobqueue --concurrency {concurrency}"
        self.config = f"sa-jobqueue worker --concurrency {concurrency}"


class SaJobqueueTagged(SaJobqueue):
    """Every job enqueued with three tags and a small meta; with ``gin``, a GIN index on the
    tags too (sa_jobqueue ships none): what the columns, and an index on them, cost the
    enqueue, the claim and the completion beside the plain ``sa_jobqueue``."""

    options = {
        "tags": ["bench", "drain", "customer:42"],
        "meta": {"source": "bench", "request": "7f3c9a2e4b1d"},
    }

    def __init__(self, gin: bool = False) -> None:
        self.gin = gin
        self.key = "sa_jobqueue_tag_gin" if gin else "sa_jobqueue_tagged"
        self.label = "sa_jobqueue tags+gin" if gin else "sa_jobqueue tags"
        index = ", a GIN index on tags" if gin else ", no index on them"
        self.config = f"{SaJobqueue.config}; jobs with 3 tags and a 2-key meta{index}"

    def install(self, dsn: str) -> None:
        super().install(dsn)
        if self.gin:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(
                    "CREATE INDEX sa_jobqueue_jobs_tags_idx ON sa_jobqueue_jobs USING gin (tags)"
                )


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


class SaJobqueueOneSession(SaJobqueueProcesses):
    """N separately started ``sa-jobqueue worker`` commands in one session, as a shell runs them.

    The harness starts each command in a session of its own; with the kernel's autogroup
    scheduling (``/proc/sys/kernel/sched_autogroup_enabled``) each session gets an equal share
    of a busy machine's CPU, so N commands get N shares and one ``--processes N`` gets one.
    This runs N plain workers under one shell, in one session: the same share as a supervisor.
    """

    label = "sa_jobqueue, workers in one session"

    def __init__(self, processes: int = 2) -> None:
        super().__init__(processes)
        self.key = f"sa_jobqueue_one_session{processes}"
        self.config = f"{processes} x sa-jobqueue worker --concurrency 10, one session"

    def worker_argv(self, kind: Kind) -> list[str]:
        one = shlex.join(SaJobqueue.worker_argv(self, kind))
        starts = "; ".join(f"{one} & p{i}=$!" for i in range(self.processes))
        pids = " ".join(f"$p{i}" for i in range(self.processes))
        # SIGTERM to the shell goes to every worker, and the shell waits for them all.
        return ["sh", "-c", f'{starts}; trap "kill -TERM {pids}; wait" TERM; wait']
