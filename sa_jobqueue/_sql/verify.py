"""``sa-jobqueue verify``: the run's two record tables, and every statement the run executes.

The tables live in the run's own schema, beside the queue's; the handler writes them (see
:mod:`sa_jobqueue.verify.tasks`) and the report compares them with the jobs table.
"""

from __future__ import annotations

from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Float,
    Identity,
    Integer,
    MetaData,
    Select,
    Table,
    bindparam,
    cast,
    exists,
    func,
    insert,
    select,
)
from sqlalchemy.schema import CreateSchema, DropSchema
from sqlalchemy.sql.dml import Insert, ReturningInsert

from ..models import FINISHED_STATUSES, RUNNING, SUCCEEDED, jobs_table, workers_table

j = jobs_table.c
w = workers_table.c

metadata = MetaData()
#: One row per execution of the handler, written outside the job's transaction.
runs = Table(
    "verify_runs",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("job_id", BigInteger, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("pid", Integer, nullable=False),
    # clock_timestamp(), not now(): the moment of the insert, not of its transaction's start.
    Column(
        "started_at",
        DateTime(timezone=True),
        server_default=func.clock_timestamp(),
        nullable=False,
    ),
)
#: The handler's exactly-once effect, written through ctx.session. Deliberately no unique
#: constraint on job_id: a second row must be counted, not rejected (a rejected insert would
#: only turn a duplicate into a retry).
results = Table(
    "verify_results",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("job_id", BigInteger, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column(
        "finished_at",
        DateTime(timezone=True),
        server_default=func.clock_timestamp(),
        nullable=False,
    ),
)


# -- setting up and tearing down -------------------------------------------------------------


def create_schema(name: str) -> CreateSchema:
    """``CREATE SCHEMA`` for the run; ``name`` is one verify generated, never user input."""
    return CreateSchema(name)


def drop_schema(name: str) -> DropSchema:
    """``DROP SCHEMA ... CASCADE``: the run's schema and everything in it."""
    return DropSchema(name, cascade=True)


# -- during the run --------------------------------------------------------------------------


@cache
def registered_pids() -> Select[int]:
    """The process ids of the workers in the registry."""
    return select(w.pid)


@cache
def progress() -> Select[int, int]:
    """Jobs succeeded, and jobs finished in any way."""
    return select(
        func.count().filter(j.status == SUCCEEDED),
        func.count().filter(j.status.in_(FINISHED_STATUSES)),
    )


@cache
def running_per_worker_pid() -> Select[int, int]:
    """Per registered worker process: how many jobs it is running."""
    return (
        select(w.pid, func.count())
        .select_from(jobs_table.join(workers_table, w.name == j.worker))
        .where(j.status == RUNNING)
        .group_by(w.pid)
    )


@cache
def wall_clock() -> Select[datetime]:
    """The database's clock at this moment (``clock_timestamp()``, not the transaction's)."""
    return select(func.clock_timestamp())


@cache
def record_run() -> ReturningInsert[datetime]:
    """Record an execution of ``:job_id``'s ``:attempt`` by process ``:pid``; its start time."""
    return (
        insert(runs)
        .values(
            job_id=bindparam("job_id", type_=BigInteger),
            attempt=bindparam("attempt", type_=Integer),
            pid=bindparam("pid", type_=Integer),
        )
        .returning(runs.c.started_at)
    )


@cache
def record_result() -> Insert:
    """Record the result of ``:job_id``'s ``:attempt``, run by ``:pid`` from ``:started_at``."""
    return insert(results).values(
        job_id=bindparam("job_id", type_=BigInteger),
        attempt=bindparam("attempt", type_=Integer),
        pid=bindparam("pid", type_=Integer),
        started_at=bindparam("started_at", type_=results.c.started_at.type),
    )


# -- what the run left -----------------------------------------------------------------------


@cache
def jobs_per_status() -> Select[str, int]:
    """Jobs per status."""
    return select(j.status, func.count()).group_by(j.status)


@cache
def result_rows() -> Select[int, int]:
    """Result rows, and the distinct jobs they are for."""
    return select(func.count(), func.count(results.c.job_id.distinct()))


@cache
def successes_without_result() -> Select[int]:
    """Succeeded jobs with no result row."""
    has_result = exists().where(results.c.job_id == j.id)
    return select(func.count()).where(j.status == SUCCEEDED, ~has_result)


@cache
def results_without_success() -> Select[int]:
    """Jobs with a result row that did not succeed (or no longer exist)."""
    return (
        select(func.count(results.c.job_id.distinct()))
        .select_from(results.outerjoin(jobs_table, j.id == results.c.job_id))
        .where(j.status.is_distinct_from(SUCCEEDED))
    )


@cache
def executions() -> Select[int, int, int]:
    """Executions in all, jobs run more than once, and those of them the killed worker ran.

    ``:killed_pid`` is the killed worker's process id (-1 when none was killed).
    """
    per_job = (
        select(
            runs.c.job_id,
            func.count().label("n"),
            func.bool_or(runs.c.pid == bindparam("killed_pid", type_=Integer)).label("killed"),
        )
        .group_by(runs.c.job_id)
        .subquery()
    )
    return select(
        func.coalesce(func.sum(per_job.c.n), 0),
        func.count().filter(per_job.c.n > 1),
        func.count().filter(per_job.c.n > 1, per_job.c.killed),
    )


@cache
def reclaimed() -> Select[int]:
    """Jobs claimed more than once."""
    return select(func.count()).where(j.attempts > 1)


@cache
def start_latency_ms() -> Select[Any]:
    """p50, p95, p99 and max milliseconds from enqueue to the start of the first execution."""
    # Enqueue to the start of the handler's first run, both by the database's clock.
    first = (
        select(runs.c.job_id, func.min(runs.c.started_at).label("started"))
        .group_by(runs.c.job_id)
        .subquery()
    )
    wait_ms = cast(func.extract("epoch", first.c.started - j.created_at) * 1000, Float)
    return select(
        func.percentile_cont(0.5).within_group(wait_ms),
        func.percentile_cont(0.95).within_group(wait_ms),
        func.percentile_cont(0.99).within_group(wait_ms),
        func.max(wait_ms),
    ).select_from(jobs_table.join(first, first.c.job_id == j.id))


@cache
def drain_seconds() -> Select[Any]:
    """Seconds from the first enqueue to the last finish."""
    return select(func.extract("epoch", func.max(j.finished_at) - func.min(j.created_at)))


@cache
def finished_before() -> Select[int, Any]:
    """Jobs finished by ``:killed_at``, and the seconds from the first enqueue to it."""
    killed_at = bindparam("killed_at", type_=j.finished_at.type)
    return select(
        func.count().filter(j.finished_at <= killed_at),
        func.extract("epoch", killed_at - func.min(j.created_at)),
    )
