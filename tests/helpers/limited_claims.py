"""The worker's limited claim, driven from a test: the real ``LaneClaimer._claim_limited``.

A worker runs the limited claim (``claim_limits.claim_limited``, one statement) on its autocommit
``HeldConnection``. A test passes the claimer either a real ``HeldConnection`` (it commits, as
the worker's does), or :class:`InCaller`, which runs it in the caller's own transaction (the
rolled-back tests of tests/integration), or :class:`Checked`, which runs it in a transaction
of its own and a check after it, before the COMMIT, while the claim still holds the queue's
row lock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import sqlalchemy as sa

from sa_jobqueue._sql import transitions
from sa_jobqueue.database import HeldConnection
from sa_jobqueue.models import RUNNING, jobs_table
from sa_jobqueue.worker._claimed import Claimed
from sa_jobqueue.worker._claimer import LaneClaimer, LimitedQueues
from sa_jobqueue.worker._lanes import Lane
from sa_jobqueue.worker._leases import LeaseTable

T = TypeVar("T")
j = jobs_table.c


class InCaller:
    """Runs a limited claim's statements on ``conn``, in the transaction the caller has open."""

    def __init__(self, conn: sa.Connection) -> None:
        self.conn = conn

    def rows(self, statement: sa.Executable, params: dict[str, Any], *, again: bool = False) -> Any:
        return list(self.conn.execute(statement, params).all())


class Checked:
    """Runs each limited claim in a transaction of its own on one connection of ``engine``, and
    ``check(conn, result)`` after the claim's statements, before its COMMIT (the queue's row is
    still locked, so no other claim of the queue can run meanwhile)."""

    def __init__(
        self, engine: sa.Engine, check: Callable[[sa.Connection, Any], None] | None = None
    ) -> None:
        self._engine = engine.execution_options(isolation_level="READ COMMITTED")
        self._check = check
        self._conn: sa.Connection | None = None

    def rows(self, statement: sa.Executable, params: dict[str, Any], *, again: bool = False) -> Any:
        if self._conn is None:
            self._conn = self._engine.connect()
        with self._conn.begin():
            result = list(self._conn.execute(statement, params).all())
            if self._check is not None:
                self._check(self._conn, result)
        return result

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def limited_claimer(
    on: HeldConnection | InCaller | Checked, worker: str = "w", *, keyed: Sequence[str] = ()
) -> LaneClaimer:
    """A LaneClaimer whose claims run on ``on``; only ``_claim_limited`` may be called (it has
    no lane or lease table, and takes the queues in ``keyed``, no others, for those with a
    limit per key)."""
    limited = LimitedQueues(cast(HeldConnection, None))
    limited._keyed = frozenset(keyed)
    return LaneClaimer(
        cast(Lane, None),
        cast(HeldConnection, on),
        worker,
        cast(LeaseTable, None),
        submit=lambda lane, job: None,
        limited=limited,
    )


def claim_limited(claimer: LaneClaimer, queue: str, limit: int) -> list[Claimed]:
    """The jobs one limited claim of up to ``limit`` took from ``queue``."""
    jobs, _ = claimer._claim_limited(queue, limit)
    return jobs


def live(conn: sa.Connection, queue: str) -> int:
    """How many of ``queue``'s jobs run with a live lease (hold a slot), as ``conn`` sees it."""
    query = sa.select(sa.func.count()).where(
        j.queue == queue, j.status == RUNNING, j.visible_at > sa.func.now()
    )
    return int(conn.execute(query).scalar_one())


INSERT = sa.text(
    "INSERT INTO sa_jobqueue_jobs (queue, task, payload)"
    " SELECT :queue, 'work', CASE WHEN CAST(:keys AS integer) IS NULL THEN '{}'::jsonb"
    " ELSE jsonb_build_object('customer', 'c' || (n % :keys)) END"
    " FROM generate_series(0, :n - 1) AS n"
)


def add_due(conn: sa.Connection, queue: str, n: int, *, keys: int | None = None) -> None:
    """``n`` due jobs in ``queue``; with ``keys``, their payloads' ``customer`` take that many
    values in turn (``c0``, ``c1``, ...)."""
    conn.execute(INSERT, {"queue": queue, "n": n, "keys": keys})


def finish(conn: sa.Connection, jobs: Sequence[Any]) -> int:
    """Complete running jobs (anything with ``id`` and ``attempts``: a Claimed, a row) with
    the worker's own statement, fenced by attempt; how many it completed."""
    params = {"job_ids": [c.id for c in jobs], "attempt_list": [c.attempts for c in jobs]}
    return len(conn.execute(transitions.complete_many(), params).all())
