"""``purge``: deleting finished jobs in bounded batches, and its dry run ``count_purge``."""

from __future__ import annotations

from collections.abc import Collection
from datetime import timedelta
from typing import Any

from sqlalchemy import Connection

from .._sql.finished import count_purgeable, purge_batch
from .._validation import check_queue_name, check_task_name
from ..errors import InvalidJobError
from ..models import FINISHED_STATUSES
from .filters import check_age, check_limit, check_statuses


def purge(
    conn: Connection,
    statuses: Collection[str],
    older_than: timedelta,
    queue: str | None = None,
    task: str | None = None,
    batch: int = 1000,
) -> int:
    """Delete finished jobs of ``statuses`` that finished more than ``older_than`` ago.

    ``statuses`` must be finished ones (succeeded, dead, cancelled); queued and running jobs
    are refused with InvalidJobError. Deletes in batches of at most ``batch`` rows, committing
    each on ``conn``, so locks are held briefly and an interrupted purge keeps what it did;
    ``conn`` must therefore not be inside a transaction. Returns the number of jobs deleted.

    Rows locked by someone else at that moment (a job being requeued) are skipped, not
    waited for. Not atomic: a job that finishes while the purge runs may or may not go.
    """
    params = _purge_params(statuses, older_than, queue, task)
    params["batch"] = check_limit(batch, "batch")
    if conn.in_transaction():
        raise InvalidJobError(
            "purge commits batch by batch: pass a Connection with no transaction in progress"
        )
    statement = purge_batch(queue is not None, task is not None)
    deleted = 0
    after_id = 0
    while True:
        with conn.begin():
            ids = conn.execute(statement, {**params, "after_id": after_id}).scalars().all()
        deleted += len(ids)
        # Fewer rows than asked means no unlocked row is left past after_id.
        if len(ids) < batch:
            return deleted
        after_id = max(ids)


def count_purge(
    conn: Connection,
    statuses: Collection[str],
    older_than: timedelta,
    queue: str | None = None,
    task: str | None = None,
) -> int:
    """How many jobs :func:`purge` would delete now (a dry run); in ``conn``'s transaction."""
    params = _purge_params(statuses, older_than, queue, task)
    statement = count_purgeable(queue is not None, task is not None)
    return conn.execute(statement, params).scalar_one()


def _purge_params(
    statuses: Collection[str], older_than: timedelta, queue: str | None, task: str | None
) -> dict[str, Any]:
    wanted = check_statuses(statuses)
    live = [s for s in wanted if s not in FINISHED_STATUSES]
    if live:
        raise InvalidJobError(
            f"refusing to purge {' and '.join(live)} jobs: only finished ones"
            f" ({', '.join(FINISHED_STATUSES)}) can be purged; cancel a job first"
        )
    params: dict[str, Any] = {"statuses": wanted, "older_than": check_age(older_than)}
    if queue is not None:
        params["queue"] = check_queue_name(queue)
    if task is not None:
        params["task"] = check_task_name(task)
    return params
