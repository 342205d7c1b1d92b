"""Retry the dead jobs matching a filter: one bounded batch at a time, in the caller's transaction.

``sa-jobqueue jobs retry --queue ...`` and the dashboard's "Retry all matching" both call
:func:`requeue_dead_jobs`. The CLI runs every batch, each in a transaction of its own and
committed, going on from the last batch's highest id; the dashboard runs one batch per click,
in the click's transaction. (``purge`` commits its batches itself because it only deletes; a
batch here is left to the caller, so that it commits with whatever else the caller does.)
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final

from .._binds import SessionLike, connection_of
from .._enqueue import wake
from .._sql.finished import requeue_dead_batch
from .filters import (
    RequeueAttempts,
    check_after_id,
    check_ids,
    check_limit,
    filter_params,
    requeue_resets,
)

#: Dead jobs one batch looks at (one statement, one transaction). A batch locks these rows and
#: writes a new version of each, with its index entries, so its cost follows its size: about
#: 14 µs a job on the 2 shared cores the tests run on (5,000 in 60 to 140 ms). 5,000 keeps a
#: batch far below the dashboard's statement timeout (15 s) and the CLI's (60 s) on a server
#: fifty times slower, and the locks brief, while one click of the dashboard still retries a
#: few thousand jobs. (The CLI took 500 a transaction before, the dashboard 10,000 a click.)
REQUEUE_BATCH: Final = 5_000


@dataclass(frozen=True)
class RequeuedBatch:
    """What one batch of :func:`requeue_dead_jobs` did."""

    #: Jobs queued again.
    requeued: int
    #: Jobs the batch picked and left dead: a waiting, queued or running job of the task holds
    #: the unique key.
    kept: int
    #: The highest id the batch picked: pass it as ``after_id`` for the next batch (None when
    #: it picked none).
    last_id: int | None
    #: Whether the batch was full: more dead jobs may match past ``last_id``.
    more: bool


def requeue_dead_jobs(
    session: SessionLike,
    *,
    queue: str | None = None,
    task: str | None = None,
    older_than: timedelta | None = None,
    attempts: RequeueAttempts = "extend",
    after_id: int | None = None,
    batch: int = REQUEUE_BATCH,
    ids: Collection[int] | None = None,
) -> RequeuedBatch:
    """Requeue up to ``batch`` dead jobs matching the filters, lowest ids first, due now.

    In the caller's transaction, never committing: each job as :func:`requeue_job` would
    (``attempts`` "extend" or "reset"), one NOTIFY per queue waking its workers at commit.
    ``older_than`` is the age since ``created_at``; ``after_id`` starts the batch past that id
    (the previous batch's ``last_id``). ``ids`` (at most
    :data:`~sa_jobqueue.ops.filters.MAX_IDS`) narrows the batch to those jobs, with the filters.
    Bad arguments raise InvalidJobError before any SQL.

    Not promised: every match. A job another session holds locked at that moment (being
    requeued or purged) is passed over, not waited for, and one that dies after the batch
    went past its id is left for another call. A job whose unique key a live job holds
    stays dead (counted in ``kept``).
    """
    reset = requeue_resets(attempts)
    params: dict[str, Any] = {"b_batch": check_limit(batch, "batch"), "b_after_id": 0}
    given, flags = filter_params(queue, task, older_than)
    params.update(given)
    if after_id is not None:
        params["b_after_id"] = check_after_id(after_id)
    if ids is not None:
        params["b_ids"] = check_ids(ids)
    statement = requeue_dead_batch(reset, ids=ids is not None, **flags)
    conn = connection_of(session)
    picked = conn.execute(statement, params).all()
    queues = sorted({q for _, q in picked if q is not None})
    for name in queues:
        wake(conn, name)
    requeued = sum(1 for _, q in picked if q is not None)
    return RequeuedBatch(
        requeued=requeued,
        kept=len(picked) - requeued,
        last_id=picked[-1][0] if picked else None,
        more=len(picked) == batch,
    )
