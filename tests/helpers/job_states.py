"""Jobs in any state, written straight into the table, for the operator tests.

Running a worker to get a job into a state (dead, running with an expired lease, finished two
hours ago) would be slow and timing-dependent; these helpers insert the row as it would be.
Times are offsets from the database's ``now()`` in seconds: positive is the past for
``*_ago``, the future for ``visible_in``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy import func

from sa_jobqueue.models import FINISHED_STATUSES, jobs_table, workers_table

j = jobs_table.c

ERROR = {"type": "ValueError", "message": "bad input", "traceback": "Traceback ...\nValueError"}


def ago(seconds: float) -> Any:
    return func.now() - timedelta(seconds=seconds)


def add_job(
    conn: sa.Connection,
    *,
    queue: str = "default",
    task: str = "work",
    status: str = "queued",
    attempts: int = 0,
    max_attempts: int = 5,
    visible_in: float = 0.0,
    created_ago: float = 0.0,
    started_ago: float | None = None,
    finished_ago: float | None = None,
    last_error: Any = None,
    unique_key: str | None = None,
    payload: Any = None,
    tags: list[str] | None = None,
    meta: dict[str, Any] | None = None,
) -> int:
    """Insert one job row as it would look in ``status``; returns its id."""
    if status in FINISHED_STATUSES and finished_ago is None:
        finished_ago = 0.0
    values: dict[str, Any] = {
        "queue": queue,
        "task": task,
        "payload": payload if payload is not None else {"n": 1},
        "status": status,
        "attempts": attempts,
        "max_attempts": max_attempts,
        "visible_at": ago(-visible_in),
        "created_at": ago(created_ago),
        "started_at": ago(started_ago) if started_ago is not None else None,
        "finished_at": ago(finished_ago) if finished_ago is not None else None,
        "last_error": last_error,
        "unique_key": unique_key,
        "tags": tags,
        "meta": meta,
    }
    job_id: int = conn.execute(sa.insert(jobs_table).values(values).returning(j.id)).scalar_one()
    return job_id


def add_dead(conn: sa.Connection, **options: Any) -> int:
    """A job that used up its attempts and died ``finished_ago`` seconds ago (default now)."""
    options.setdefault("max_attempts", 3)
    options.setdefault("attempts", options["max_attempts"])
    options.setdefault("last_error", ERROR)
    options.setdefault("started_ago", options.get("finished_ago", 0.0) + 1)
    return add_job(conn, status="dead", **options)


def add_worker(conn: sa.Connection, name: str, *, seen_ago: float = 0.0) -> None:
    """A worker-registry row last seen ``seen_ago`` seconds ago."""
    conn.execute(
        sa.insert(workers_table).values(
            name=name,
            host="host-a",
            pid=4242,
            queues=["default"],
            concurrency=4,
            started_at=ago(seen_ago + 60),
            last_seen_at=ago(seen_ago),
        )
    )
