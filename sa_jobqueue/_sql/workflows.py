"""Workflows: drawing a workflow's id, and reading, cancelling, retrying and deleting its jobs.

A workflow's jobs are found by ``workflow_id`` in the partial index of revision ``sajq_0017``
(jobs of no workflow are not in it). None of these statements is on the claim or completion
path: those never read the column. Cancelling reuses :func:`.bulk.cancel_batch` by ids, and
what waits for a cancelled job is settled in that statement, as for any cancel.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Final

from sqlalchemy import (
    BigInteger,
    Delete,
    Integer,
    Select,
    Update,
    any_,
    bindparam,
    case,
    cast,
    delete,
    exists,
    func,
    literal,
    select,
    update,
)

from .._validation import MAX_ATTEMPTS
from ..models import (
    CANCELLED,
    DEAD,
    FINISHED_STATUSES,
    QUEUED,
    UNIQUE_STATUSES,
    WAITING,
    dependencies_table,
    jobs_table,
    workflow_ids,
)
from .arrays import id_array
from .dashboard import LISTED

j = jobs_table.c
e = dependencies_table.c

#: The advisory lock class of workflow operations ("sajw" in ASCII), the first key of the
#: two-key form: its keys are a space apart from the one-key (bigint) form, so an
#: application's own bigint advisory locks never meet these.
WORKFLOW_LOCK_CLASS: Final = 0x73616A77

#: The columns of a workflow's job as its reads show them: a job's as every list shows them
#: (``dashboard.LISTED``, the fields of ``ops.admin.JobSummary``), and the step's name.
JOB_FIELDS: Final = (*LISTED, "workflow_step")


def _workflow() -> Any:
    return bindparam("workflow_id", type_=BigInteger)


@cache
def next_workflow_id() -> Select[Any]:
    """A new workflow's id, from the sequence of revision ``sajq_0017``."""
    return select(workflow_ids.next_value())


@cache
def lock_workflow() -> Select[Any]:
    """Wait for, then hold until the transaction ends, the lock of workflow ``:workflow_id``.

    Every operation on an existing workflow (cancel, retry, delete, adding steps) takes it
    first, so they run one after the other; each then reads the jobs in a statement of its
    own, whose snapshot sees what the one before committed (steps added meanwhile included).
    Without it a cancel could miss a step added in a transaction that commits after the
    cancel read the jobs. ``hashint8`` folds the bigint id into the lock's second (integer)
    key: two workflows that fold alike only wait for each other.
    """
    key = func.hashint8(_workflow())
    return select(func.pg_advisory_xact_lock(literal(WORKFLOW_LOCK_CLASS, Integer), key))


@cache
def workflow_jobs(locked: bool) -> Select[Any]:
    """Up to ``:most`` jobs of workflow ``:workflow_id`` (:data:`JOB_FIELDS`), lowest id first.

    With ``locked`` each row is locked ``FOR NO KEY UPDATE`` (the lock a worker's statements
    that end a job take), waiting for a worker that is ending it at this moment rather than
    skipping it: an operation on a whole workflow acts on all of it or on nothing. Rows are
    locked in id order, as the settling of dependencies locks them (a dependent always has a
    higher id than what it waits for), so the two do not deadlock.
    """
    stmt = (
        select(*(j[name] for name in JOB_FIELDS), j.unique_key)
        .where(j.workflow_id == _workflow())
        .order_by(j.id)
        .limit(bindparam("most", type_=Integer))
    )
    return stmt.with_for_update(key_share=True) if locked else stmt  # FOR NO KEY UPDATE


@cache
def status_counts() -> Select[Any]:
    """How many jobs of workflow ``:workflow_id`` are in each status (its whole size, which a
    page of :func:`workflow_jobs` may not show)."""
    return (
        select(j.status, func.count())
        .where(j.workflow_id == _workflow())
        .group_by(j.status)
        .order_by(j.status)
    )


@cache
def edges_from() -> Select[Any]:
    """The edges of the jobs ``:job_ids`` (what each waits for), by the edges' primary key:
    (job_id, depends_on, on_failure, pending), in that order."""
    return (
        select(e.job_id, e.depends_on, e.on_failure, e.pending)
        .where(e.job_id == any_(id_array("job_ids")))
        .order_by(e.job_id, e.depends_on)
    )


@cache
def statuses_of() -> Select[Any]:
    """The id and status of each of the jobs ``:job_ids`` that still exists."""
    return select(j.id, j.status).where(j.id == any_(id_array("job_ids")))


@cache
def keys_held_elsewhere() -> Select[Any]:
    """Which of the finished jobs ``:job_ids`` have a unique key that a live job of their task
    holds: queued again, they would break the unique index (and the caller's transaction)."""
    live = jobs_table.alias("live")
    held = exists().where(
        live.c.task == j.task,
        live.c.unique_key == j.unique_key,
        live.c.status.in_(UNIQUE_STATUSES),
        live.c.unique_key.is_not(None),
    )
    return select(j.id).where(j.id == any_(id_array("job_ids")), j.unique_key.is_not(None), held)


@cache
def pend_edges() -> Update:
    """Make the settled edges from ``:waiters`` to ``:retried`` pending again: each retried
    job, when it ends anew, settles them as any ending does (once, in its statement)."""
    return (
        update(dependencies_table)
        .where(
            e.depends_on == any_(id_array("retried")),
            e.job_id == any_(id_array("waiters")),
            ~e.pending,
        )
        .values(pending=True)
    )


@cache
def retry_jobs(reset: bool) -> Update:
    """Move the dead or cancelled jobs ``:retried`` back: ``waiting`` while one of their edges
    is pending (run :func:`pend_edges` first), else ``queued`` and due now. Compare-and-set on
    the status; returns (id, status, queue) of each moved.

    Attempts as :func:`.finished.requeue_dead` treats them: ``reset`` starts them from 0,
    otherwise ``max_attempts`` is raised by the attempts used. ``last_error`` and the
    attempt history are kept, as a requeue keeps them.
    """
    pending = exists().where(e.job_id == j.id, e.pending)
    stmt = update(jobs_table).where(
        j.id == any_(id_array("retried")), j.status.in_([DEAD, CANCELLED])
    )
    if reset:
        stmt = stmt.values(attempts=0)
    else:
        # In bigint, as requeue_dead does: attempts + max_attempts cannot overflow.
        stmt = stmt.where(j.attempts < MAX_ATTEMPTS).values(
            max_attempts=func.least(cast(j.attempts, BigInteger) + j.max_attempts, MAX_ATTEMPTS)
        )
    return stmt.values(
        status=case((pending, WAITING), else_=QUEUED),
        visible_at=func.now(),
        finished_at=None,
        worker=None,
        cancel_requested=False,
    ).returning(j.id, j.status, j.queue)


@cache
def delete_edges() -> Delete:
    """Delete the edges of the jobs ``:job_ids``: what they waited for (made with them)."""
    return delete(dependencies_table).where(e.job_id == any_(id_array("job_ids")))


@cache
def delete_jobs() -> Any:
    """Delete the finished jobs of ``:job_ids``; returns the ids deleted (compare-and-set on a
    finished status: a job requeued meanwhile stays)."""
    return (
        delete(jobs_table)
        .where(j.id == any_(id_array("job_ids")), j.status.in_(FINISHED_STATUSES))
        .returning(j.id)
    )
