"""What the task modules in this package share: their audit and effects tables, and the writes.

Each task module records every execution of a handler in its own *runs* table through an
autocommit connection of its own (so the table counts every execution, including attempts whose
transaction was rolled back or whose worker was killed), and writes the effect that must
happen at most once to its own *effects* table through ``ctx.session`` (so it commits with the
job's completion, or not at all). A :class:`Recorder` does both for one module.

What differs between the modules stays in the module, spelled out where the tables and the
:class:`Recorder` are made: whether the effects table allows one row per job only, the extra
columns of the runs table, and the size of the audit engine's pool.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from sa_jobqueue import JobContext
from sa_jobqueue.database import create_engine


def effects_table(name: str, metadata: sa.MetaData, *, one_per_job: bool) -> sa.Table:
    """An effects table: ``job_id``, ``attempt``, ``pid``.

    With ``one_per_job`` the job id is the primary key, so the database itself refuses a second
    effect of a job. Without it the table has an identity key and an index on ``job_id``
    instead, so two attempts of one job can both insert their row without blocking each other:
    only the worker's fenced completion then stands between a stale attempt and a duplicate.
    """
    if one_per_job:
        keys = [sa.Column("job_id", sa.BigInteger, primary_key=True)]
    else:
        keys = [
            sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
            sa.Column("job_id", sa.BigInteger, nullable=False, index=True),
        ]
    return sa.Table(
        name,
        metadata,
        *keys,
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
    )


def runs_table(
    name: str, metadata: sa.MetaData, *columns: sa.Column[Any], index_job_id: bool = True
) -> sa.Table:
    """An audit table of executions: ``id``, ``job_id``, ``attempt``, ``pid``, then ``columns``."""
    return sa.Table(
        name,
        metadata,
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("job_id", sa.BigInteger, nullable=False, index=index_job_id),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        *columns,
    )


def started_and_returned() -> list[sa.Column[Any]]:
    """The audit columns for when a handler started, and when it said it was about to return."""
    return [
        sa.Column("started_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
        sa.Column("returned_at", sa.DateTime(timezone=True)),
    ]


class Recorder:
    """Writes one task module's audit rows and effects.

    ``engine_options`` configure the audit engine, which each worker process creates on first
    use, on the same database the worker uses, with ``isolation_level="AUTOCOMMIT"``.
    """

    def __init__(self, runs: sa.Table, effects: sa.Table, **engine_options: Any) -> None:
        self.runs = runs
        self.effects = effects
        self._engine_options = engine_options
        self._lock = threading.Lock()
        self._engine: sa.Engine | None = None

    def engine(self, ctx: JobContext) -> sa.Engine:
        """This process's autocommit engine, on the same database the worker uses."""
        with self._lock:
            if self._engine is None:
                url = ctx.session.get_bind().engine.url
                self._engine = create_engine(
                    url, isolation_level="AUTOCOMMIT", **self._engine_options
                )
            return self._engine

    def record_run(self, ctx: JobContext) -> int:
        """Count this execution outside the job's transaction; return the audit row's id."""
        runs = self.runs
        with self.engine(ctx).connect() as conn:
            return int(
                conn.execute(
                    runs.insert()
                    .values(job_id=ctx.job_id, attempt=ctx.attempt, pid=os.getpid())
                    .returning(runs.c.id)
                ).scalar_one()
            )

    def write_effect(self, ctx: JobContext) -> None:
        """The effect: committed together with the job's completion, or not at all."""
        ctx.session.execute(
            self.effects.insert().values(job_id=ctx.job_id, attempt=ctx.attempt, pid=os.getpid())
        )


def wait_for_file(path: Path, timeout: float) -> None:
    """Block until ``path`` exists (the test creates it); raise TimeoutError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.02)
