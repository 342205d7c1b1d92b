"""What operators and the application do to jobs from outside a worker."""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import (
    BigInteger,
    Select,
    Update,
    bindparam,
    func,
    select,
    update,
)

from ..models import (
    CANCELLED,
    QUEUED,
    RUNNING,
    WAITING,
    jobs_table,
)
from .dependencies import settled_here

j = jobs_table.c


@cache
def cancel_queued() -> Update:
    """Cancel ``:job_id`` if it is still waiting (queued, or waiting for dependencies); it will
    never run. What waits for it is settled in the same statement."""
    return (
        update(jobs_table)
        .where(j.id == bindparam("job_id", type_=BigInteger), j.status.in_([QUEUED, WAITING]))
        .values(status=CANCELLED, finished_at=func.now())
        .returning(j.id, settled_here())
    )


@cache
def request_cancel() -> Update:
    """Ask the worker running ``:job_id`` to stop it; it ends ``cancelled``, not retried."""
    return (
        update(jobs_table)
        .where(j.id == bindparam("job_id", type_=BigInteger), j.status == RUNNING)
        .values(cancel_requested=True)
        .returning(j.id)
    )


@cache
def counts() -> Select[str, str, int]:
    """Jobs per queue and status."""
    return (
        select(j.queue, j.status, func.count())
        .group_by(j.queue, j.status)
        .order_by(j.queue, j.status)
    )


@cache
def job_by_id(columns: tuple[str, ...]) -> Select[Any]:
    """The named ``columns`` of job ``:job_id``; no row if there is no such job."""
    return select(*(j[c] for c in columns)).where(j.id == bindparam("job_id", type_=BigInteger))
