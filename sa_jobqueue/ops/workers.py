"""The worker registry: each worker process keeps a row of its own, seen at every heartbeat.

The registry is informational (``stats``, ``check``): no claim depends on it, so a worker
whose row was expired keeps working. Each function runs in the connection's transaction (a
worker's control engine is in autocommit, so there each is its own transaction).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from sqlalchemy import Connection

from .._sql.workers import delete_stale_workers, delete_worker, touch_worker_row, upsert_worker
from .filters import check_age


def register_worker(
    conn: Connection, name: str, host: str, pid: int, queues: Sequence[str], concurrency: int
) -> None:
    """Add (or replace) worker ``name``'s row in the registry, seen now.

    Runs in ``conn``'s transaction. The registry is informational (``stats``, ``check``):
    no claim depends on it, so a worker whose row was expired keeps working.
    """
    conn.execute(
        upsert_worker(),
        {
            "name": name,
            "host": host,
            "pid": pid,
            "queues": list(queues),
            "concurrency": concurrency,
        },
    )


def touch_worker(conn: Connection, name: str) -> bool:
    """Set worker ``name``'s ``last_seen_at`` to now; False if its row is gone (re-register)."""
    return conn.execute(touch_worker_row(), {"worker_name": name}).first() is not None


def unregister_worker(conn: Connection, name: str) -> bool:
    """Remove worker ``name``'s row (on a clean shutdown); False if there was none."""
    return conn.execute(delete_worker(), {"worker_name": name}).first() is not None


def expire_workers(conn: Connection, stale_after: timedelta) -> list[str]:
    """Remove the rows of workers not seen for ``stale_after``; returns their names."""
    params = {"stale_after": check_age(stale_after, "stale_after")}
    return list(conn.execute(delete_stale_workers(), params).scalars())
