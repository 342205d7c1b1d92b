"""The reference points: a raw INSERT + COMMIT, and a hand-written batched SKIP LOCKED loop.

The loop claims up to 100 jobs with one ``UPDATE ... FROM (SELECT ... FOR UPDATE SKIP LOCKED
LIMIT 100) RETURNING``, runs them, and marks them done with one ``UPDATE ... WHERE id =
ANY(...)``, all in autocommit: no leases, retries or fencing, just the ceiling of the pattern.
Its writing handler inserts the batch's rows and marks the batch done in one transaction
(the ceiling of exactly-once writing: the effect and the completion commit together).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType

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

BATCH = 100

CLAIM = """
    UPDATE ref_jobs SET status = 'running'
    FROM (
        SELECT id FROM ref_jobs WHERE status = 'queued'
        ORDER BY id FOR UPDATE SKIP LOCKED LIMIT %s
    ) AS claimed
    WHERE ref_jobs.id = claimed.id
    RETURNING ref_jobs.id, ref_jobs.n
"""
DONE = "UPDATE ref_jobs SET status = 'done' WHERE id = ANY(%s)"
WRITE = "INSERT INTO bench_results (n) SELECT unnest(%s::int[])"


class Reference(System):
    key = "reference"
    label = "reference: raw SQL / batched loop"
    config = (
        "one psycopg connection, claim 100 per UPDATE ... SKIP LOCKED, done in one UPDATE;"
        " writing: the batch's rows and its completion in one transaction"
    )
    peer = False
    pending_sql = "SELECT n FROM ref_jobs WHERE status IN ('queued', 'running')"
    history_sql = """
        INSERT INTO ref_jobs (n, status) SELECT -g, 'done' FROM generate_series(1, %(n)s) AS g
    """
    tables = ("ref_jobs",)

    def install(self, dsn: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE ref_jobs (id bigserial PRIMARY KEY, n integer NOT NULL,"
                " status text NOT NULL DEFAULT 'queued')"
            )
            conn.execute(
                "CREATE INDEX ref_jobs_claim ON ref_jobs (id) WHERE status IN ('queued', 'running')"
            )
        install_results_table(dsn)

    @contextmanager
    def producer(self, dsn: str, kind: Kind) -> Iterator[Producer]:
        with psycopg.connect(dsn) as conn:

            def enqueue(n: int) -> None:
                conn.execute("INSERT INTO ref_jobs (n) VALUES (%s)", (n,))
                conn.commit()

            yield enqueue

    def enqueue_bulk(
        self, dsn: str, keys: Sequence[int], kind: Kind, batch: int | None = None
    ) -> None:
        with psycopg.connect(dsn) as conn:
            for part in chunks(keys, batch):
                conn.execute("INSERT INTO ref_jobs (n) SELECT unnest(%s::int[])", (list(part),))
                conn.commit()

    def worker_argv(self, kind: Kind) -> list[str]:
        return peer_worker_argv(self, kind)

    def run_worker(self, dsn: str, kind: Kind) -> None:
        stop = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                rows = conn.execute(CLAIM, (BATCH,)).fetchall()
                if not rows:
                    stop.wait(0.005)
                    continue
                for _, n in rows:
                    record(n)
                ids = [job_id for job_id, _ in rows]
                if kind in ("write", "batch_write"):  # one INSERT per claimed batch either way
                    with conn.transaction():
                        conn.execute(WRITE, ([n for _, n in rows],))
                        conn.execute(DONE, (ids,))
                else:
                    conn.execute(DONE, (ids,))
