"""The worker registry: each worker process's row, written by the worker itself.

The registry is informational (``stats``, ``check``); no claim reads it.
"""

from __future__ import annotations

from functools import cache

from sqlalchemy import (
    ARRAY,
    Integer,
    Text,
    Update,
    bindparam,
    delete,
    func,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.dml import Insert, ReturningDelete

from ..models import workers_table
from .clock import seconds

w = workers_table.c


@cache
def upsert_worker() -> Insert:
    """Register worker ``:name`` (or refresh its row if the name is already there)."""
    stmt = pg_insert(workers_table).values(
        name=bindparam("name", type_=Text),
        host=bindparam("host", type_=Text),
        pid=bindparam("pid", type_=Integer),
        queues=bindparam("queues", type_=ARRAY(Text)),
        concurrency=bindparam("concurrency", type_=Integer),
        started_at=func.now(),
        last_seen_at=func.now(),
    )
    return stmt.on_conflict_do_update(
        index_elements=[w.name],
        set_={
            "host": stmt.excluded.host,
            "pid": stmt.excluded.pid,
            "queues": stmt.excluded.queues,
            "concurrency": stmt.excluded.concurrency,
            "started_at": stmt.excluded.started_at,
            "last_seen_at": stmt.excluded.last_seen_at,
        },
    )


@cache
def touch_worker_row() -> Update:
    """Record that worker ``:worker_name`` is alive; its name, or no row if it was expired."""
    return (
        update(workers_table)
        .where(w.name == bindparam("worker_name", type_=Text))
        .values(last_seen_at=func.now())
        .returning(w.name)
    )


@cache
def delete_worker() -> ReturningDelete[str]:
    """Remove worker ``:worker_name``'s row; returns its name, or no row if there was none."""
    return (
        delete(workers_table)
        .where(w.name == bindparam("worker_name", type_=Text))
        .returning(w.name)
    )


@cache
def delete_stale_workers() -> ReturningDelete[str]:
    """Remove the rows of workers not seen for ``:stale_after`` seconds; returns their names."""
    return (
        delete(workers_table)
        .where(w.last_seen_at < func.now() - seconds("stale_after"))
        .returning(w.name)
    )
