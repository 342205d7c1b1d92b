"""Reading job rows, enqueueing in a transaction of its own, and burst runs in this process.

Every reader takes an Engine (it reads through a new connection: what is committed) or a
Connection (it reads through that one: what its transaction sees, as the rolled-back tests of
tests/integration need).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from sa_jobqueue import JobContext, JobQueue, Worker
from sa_jobqueue.models import Job, jobs_table
from sa_jobqueue.ops.health import Finding, Thresholds, check

j = jobs_table.c
Bind = sa.Engine | sa.Connection


@contextlib.contextmanager
def reading(bind: Bind) -> Iterator[sa.Connection]:
    """A connection to read through: a new one of an Engine, or the Connection itself."""
    if isinstance(bind, sa.Connection):
        yield bind
    else:
        with bind.connect() as conn:
            yield conn


@contextlib.contextmanager
def writing(bind: Bind) -> Iterator[sa.Connection]:
    """A connection to write through: a transaction of an Engine, committed at the end of the
    block, or the Connection itself (its transaction is the caller's)."""
    if isinstance(bind, sa.Connection):
        yield bind
    else:
        with bind.begin() as conn:
            yield conn


def statuses(
    bind: Bind, ids: Sequence[int] | None = None, queue: str | None = None
) -> Counter[str]:
    """How many jobs (of ``ids``, of ``queue``, by default all) are in each status."""
    query = sa.select(j.status, sa.func.count()).group_by(j.status)
    if ids is not None:
        query = query.where(j.id.in_(ids))
    if queue is not None:
        query = query.where(j.queue == queue)
    with reading(bind) as conn:
        return Counter({status: n for status, n in conn.execute(query).all()})


def status_by_id(bind: Bind) -> dict[int, str]:
    """Every job's status, by job id."""
    with reading(bind) as conn:
        return {job_id: status for job_id, status in conn.execute(sa.select(j.id, j.status))}


def succeeded(bind: Bind) -> int:
    """How many jobs succeeded."""
    return statuses(bind).get("succeeded", 0)


def count(bind: Bind, table: sa.Table | Any = jobs_table) -> int:
    """The rows of ``table`` (by default the jobs)."""
    with reading(bind) as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one()


def row(bind: Bind, job_id: int) -> Any:
    """The job's whole row (None if it is gone)."""
    with reading(bind) as conn:
        return conn.execute(sa.select(jobs_table).where(j.id == job_id)).one_or_none()


def job(bind: Bind, job_id: int) -> Job:
    """The job's row through the model, read in a session of its own and detached from it."""
    with Session(bind) as session:
        found = session.get(Job, job_id)
        assert found is not None, f"job {job_id} does not exist"
        session.expunge(found)
        return found


def job_row(bind: Bind, job_id: int) -> sa.Row[Any]:
    """The job's state and timing, with ``due``, ``due_in`` and ``ran_for`` worked out."""
    with reading(bind) as conn:
        return conn.execute(
            sa.select(
                j.status,
                j.attempts,
                j.max_attempts,
                j.last_error,
                j.visible_at,
                j.finished_at,
                j.cancel_requested,
                (j.visible_at <= sa.func.now()).label("due"),
                sa.func.extract("epoch", j.visible_at - sa.func.now()).label("due_in"),
                sa.func.extract("epoch", j.finished_at - j.started_at).label("ran_for"),
            ).where(j.id == job_id)
        ).one()


def executions(runs: sa.Table, bind: Bind, job_id: int) -> list[sa.Row[Any]]:
    """The executions of one job a task module's ``runs`` table recorded, oldest first.

    Always ``attempt``, ``pid`` and ``returned``; the columns only some tables have
    (``stop_seen``, ``cancel_seen``, and ``ran_for`` from ``started_at``) when it has them.
    """
    c = runs.c
    columns: list[Any] = [c.attempt, c.pid, c.returned_at.is_not(None).label("returned")]
    columns += [c[name] for name in ("stop_seen", "cancel_seen") if name in c]
    if "started_at" in c:
        columns.append(sa.func.extract("epoch", c.returned_at - c.started_at).label("ran_for"))
    with reading(bind) as conn:
        return list(
            conn.execute(sa.select(*columns).where(c.job_id == job_id).order_by(c.id)).all()
        )


def enqueue(
    engine: sa.Engine, task: str, payload: object = None, *, queue: JobQueue, **options: Any
) -> int:
    """Enqueue one job on ``queue`` and commit it."""
    with Session(engine) as session, session.begin():
        return queue.enqueue(session, task, payload, **options)


def enqueue_many(
    engine: sa.Engine, task: str, payloads: Iterable[object], *, queue: JobQueue, **options: Any
) -> list[int]:
    """Enqueue a job per payload on ``queue`` and commit them."""
    with Session(engine) as session, session.begin():
        return queue.enqueue_many(session, task, payloads, **options)


def burst(queue: JobQueue, engine: sa.Engine, **options: Any) -> None:
    """Run a worker in this process until no job is due (without LISTEN unless asked)."""
    options.setdefault("listen", False)
    Worker(queue, engine, **options).run(burst=True)


def handler(ctx: JobContext, payload: Any) -> None:
    """A handler for tasks the tests only enqueue, never run (its name is the task's)."""


def make_queue(**options: Any) -> JobQueue:
    """A queue with tasks ``work_a`` (queue ``a``), ``work_b`` (queue ``b``) and ``plain``."""
    queue = JobQueue(**options)
    queue.task(name="work_a", queue="a")(handler)
    queue.task(name="work_b", queue="b")(handler)
    queue.task(name="plain")(handler)
    return queue


def findings(bind: Bind, **thresholds: Any) -> dict[str, Finding]:
    """The health check's findings with these ``thresholds``, by the check's name."""
    with reading(bind) as conn:
        return {f.check: f for f in check(conn, Thresholds(**thresholds))}
