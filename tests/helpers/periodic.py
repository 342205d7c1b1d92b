"""Helpers for periodic-job tests, in-process or with real worker processes.

A periodic test cannot wait for real cron ticks (minutes apart), and a worker subprocess cannot
be handed a fake clock. What it can do is make the latest tick of a schedule due again:
:func:`rewind` moves the schedule's ``last_tick`` two years back, so the next
:func:`sa_jobqueue.periodic.enqueue_due` call of any process enqueues the latest tick (once,
whichever process wins). With a schedule that never ticks during a test run (:data:`YEARLY`),
every job then comes from a rewind, and "exactly one job per rewind" is exact:

    wait_registered(engine, "yearly")          # a worker has seen the schedule
    for round in range(1, 6):
        rewind(engine, "yearly")
        wait_for(lambda: len(periodic_jobs(engine, "yearly_task")) >= round)
    # give every worker a few more polls to enqueue a duplicate, then:
    assert len(periodic_jobs(engine, "yearly_task")) == 5

:data:`tests.apps.periodic.queue` declares such a schedule for worker subprocesses.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa

from sa_jobqueue.models import jobs_table, periodic_table
from tests.helpers.waiting import wait_for

#: Midnight on January 1st (UTC): never due by itself while a test runs (unless it runs across
#: New Year), so every job of such a schedule comes from a :func:`rewind`.
YEARLY = "0 0 1 1 *"

j = jobs_table.c
p = periodic_table.c


def rewind(engine: sa.Engine, name: str) -> None:
    """Move schedule ``name``'s ``last_tick`` two years back: its latest tick is due again."""
    with engine.begin() as conn:
        moved = conn.execute(
            sa.update(periodic_table)
            .where(p.name == name)
            .values(last_tick=p.last_tick - sa.text("interval '2 years'"))
        ).rowcount
    assert moved == 1, f"schedule {name!r} is not registered yet (see wait_registered)"


def last_tick(engine: sa.Engine, name: str) -> datetime | None:
    """The stored ``last_tick`` of schedule ``name``, or None if no process has seen it yet."""
    with engine.connect() as conn:
        value = conn.execute(sa.select(p.last_tick).where(p.name == name)).scalar_one_or_none()
    return value


def wait_registered(engine: sa.Engine, name: str, timeout: float = 30.0) -> datetime:
    """Wait until some process's ``enqueue_due`` has recorded schedule ``name``."""
    return wait_for(lambda: last_tick(engine, name), timeout=timeout)


def periodic_jobs(engine: sa.Engine, task: str) -> list[tuple[int, str]]:
    """``(job id, tick)`` of every job of ``task``, oldest first; the tick from the payload."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(j.id, j.payload["tick"].astext).where(j.task == task).order_by(j.id)
        ).all()
    return [(job_id, tick) for job_id, tick in rows]
