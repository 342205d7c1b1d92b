"""Workflow admin: read, cancel, retry and delete a workflow's jobs, in the caller's transaction.

A workflow is the jobs one chain, group, chord or DAG created (and the steps added to it
since): each carries the workflow's id. What :class:`~sa_jobqueue.workflows.Workflow`'s
methods, ``sa-jobqueue workflows`` and the dashboard do, as functions of a Session,
scoped_session or Connection: each runs in its transaction and never commits.

Each operation takes the workflow's lock first (one at a time per workflow, steps added
included), then locks all its jobs in id order and acts on all of them in one statement or
two: a workflow has at most :data:`MAX_WORKFLOW_JOBS` jobs, which bounds the transaction. An
unknown id raises :class:`~sa_jobqueue.errors.UnknownWorkflowError` and changes nothing.

What is not promised: that a running job stops at once (its cancellation is requested; its
worker ends it), nor anything about jobs outside the workflow beyond the dependency rules
(a job that waits for a cancelled step is settled by its edge's policy, as for any cancel).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from sqlalchemy import Connection

from .._binds import SessionLike, connection_of
from .._enqueue import wake
from .._sql import bulk as bulk_sql
from .._sql import workflows as workflows_sql
from .._validation import MAX_ATTEMPTS, check_job_id
from ..errors import InvalidJobError, UnknownWorkflowError, WorkflowNotFinishedError
from ..models import (
    CANCELLED,
    DEAD,
    FINISHED_STATUSES,
    QUEUED,
    RUNNING,
    STATUSES,
    SUCCEEDED,
    WAITING,
)
from .admin import Edge, JobSummary
from .filters import RequeueAttempts, requeue_resets

#: The most jobs one workflow may have: a chain, group, chord or DAG of more is refused before
#: anything is sent (the chord's callback already had its 100,000 dependencies at most). Every
#: operation on a workflow then changes at most this many jobs in its one transaction: 100,000
#: cancelled in about 5 s on the tests' 2 shared cores (1,000 in 50 ms, see ops.bulk).
MAX_WORKFLOW_JOBS: Final = 100_000

_UNFINISHED: Final = (WAITING, QUEUED, RUNNING)

#: A workflow's state, from its jobs' statuses: ``active`` while one is waiting, queued or
#: running; else ``succeeded`` if every job succeeded, or ``failed`` if one is dead or
#: cancelled.
WorkflowState = Literal["active", "succeeded", "failed"]


@dataclass(frozen=True)
class WorkflowJob(JobSummary):
    """One job of a workflow: the fields of :class:`~sa_jobqueue.ops.JobSummary` and its step's
    name (None for the jobs of a chain, group or chord)."""

    step: str | None = None


@dataclass(frozen=True)
class WorkflowInfo:
    """A workflow as the caller's transaction sees it: its jobs, lowest id first, and their
    edges (what each waits for, inside the workflow or not)."""

    id: int
    jobs: list[WorkflowJob]
    edges: list[Edge] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        """How many of its jobs are in each status, in the order of a job's life (statuses
        without jobs left out)."""
        counted = Counter(job.status for job in self.jobs)
        return {status: counted[status] for status in STATUSES if counted[status]}

    @property
    def state(self) -> WorkflowState:
        """``active``, ``succeeded`` or ``failed``: see :data:`WorkflowState`."""
        return state_of(job.status for job in self.jobs)

    @property
    def steps(self) -> dict[str, WorkflowJob]:
        """Its named steps' jobs, by name."""
        return {job.step: job for job in self.jobs if job.step is not None}


@dataclass(frozen=True)
class WorkflowChange:
    """What one operation on a workflow did."""

    workflow_id: int
    #: Jobs changed: cancelled (cancel), queued or waiting again (retry), deleted (delete).
    changed: int
    #: Running jobs whose cancellation was requested (cancel): their workers end them.
    requested: int = 0
    #: Of the retried jobs, those that wait for others again (retry).
    waiting: int = 0
    #: Jobs left as they were: already finished (cancel); dead or cancelled ones kept so
    #: because a dependency outside the workflow failed, or a live job holds their unique key
    #: (retry), and what waits for those.
    left: int = 0


def state_of(statuses: Iterable[str]) -> WorkflowState:
    """The state of a workflow whose jobs are in ``statuses`` (see :data:`WorkflowState`)."""
    found = set(statuses)
    if found & set(_UNFINISHED):
        return "active"
    return "succeeded" if found <= {SUCCEEDED} else "failed"


def check_workflow_id(workflow_id: object) -> int:
    """``workflow_id`` if it is an int of the ids' range; InvalidJobError otherwise."""
    try:
        return check_job_id(workflow_id)
    except InvalidJobError:
        raise InvalidJobError(f"a workflow id is an int, not {workflow_id!r}"[:200]) from None


def read_jobs(
    conn: Connection, workflow_id: int, *, locked: bool, most: int = MAX_WORKFLOW_JOBS
) -> list[Any]:
    """The rows of the workflow's jobs (see :func:`.._sql.workflows.workflow_jobs`), up to
    ``most``; UnknownWorkflowError if it has none."""
    params = {"workflow_id": workflow_id, "most": most}
    rows = list(conn.execute(workflows_sql.workflow_jobs(locked), params).all())
    if not rows:
        raise UnknownWorkflowError(workflow_id)
    return rows


def workflow_job(row: Any) -> WorkflowJob:
    """A row of :func:`read_jobs` as a :class:`WorkflowJob`."""
    values = row._asdict()
    values.pop("unique_key", None)
    return WorkflowJob(step=values.pop("workflow_step"), **values)


def _locked(session: SessionLike, workflow_id: object) -> tuple[Connection, int, list[Any]]:
    """The connection, the checked id and the workflow's jobs, locked (after its lock)."""
    checked = check_workflow_id(workflow_id)
    conn = connection_of(session)
    conn.execute(workflows_sql.lock_workflow(), {"workflow_id": checked})
    return conn, checked, read_jobs(conn, checked, locked=True)


def get_workflow(session: SessionLike, workflow_id: int) -> WorkflowInfo:
    """Read workflow ``workflow_id``: its jobs and their edges, as the caller's transaction
    sees them; UnknownWorkflowError if no job carries that id (none created, or all deleted).

    Takes no lock: workers change the jobs meanwhile. Jobs that pruning deleted after their
    retention are not shown.
    """
    checked = check_workflow_id(workflow_id)
    conn = connection_of(session)
    jobs = [workflow_job(row) for row in read_jobs(conn, checked, locked=False)]
    rows = conn.execute(workflows_sql.edges_from(), {"job_ids": [job.id for job in jobs]})
    return WorkflowInfo(checked, jobs, [Edge(*row) for row in rows])


def _cancel(conn: Connection, ids: list[int]) -> tuple[int, int]:
    """Cancel ``ids`` (locked by the caller) as the bulk cancel does: (cancelled, requested)."""
    if not ids:
        return 0, 0
    params = {"b_ids": ids, "b_batch": len(ids), "b_statuses": list(_UNFINISHED)}
    statement = bulk_sql.cancel_batch(ids=True, queue=False, task=False, older_than=False)
    rows = conn.execute(statement, params).all()
    return sum(1 for r in rows if r.cancelled), sum(1 for r in rows if r.requested)


def cancel_workflow(session: SessionLike, workflow_id: int) -> WorkflowChange:
    """Cancel every unfinished job of workflow ``workflow_id``, in the caller's transaction.

    As :func:`~sa_jobqueue.ops.cancel_job` does each: a waiting or queued job ends
    ``cancelled`` at once, a running one has its cancellation requested and its worker ends
    it ``cancelled``. What waits for a cancelled job, in the workflow or outside it, is
    settled in the same statement by its edge's policy. Finished jobs are left (``left``).
    """
    conn, checked, rows = _locked(session, workflow_id)
    unfinished = [row.id for row in rows if row.status in _UNFINISHED]
    cancelled, requested = _cancel(conn, unfinished)
    return WorkflowChange(checked, cancelled, requested=requested, left=len(rows) - len(unfinished))


def retry_workflow(
    session: SessionLike, workflow_id: int, *, attempts: RequeueAttempts = "extend"
) -> WorkflowChange:
    """Bring back the dead and cancelled jobs of workflow ``workflow_id``, in the caller's
    transaction; succeeded jobs are never run again.

    Each such job's edges to the others brought back are made pending again (also those of
    the workflow's jobs still waiting, which then wait for the new run): a job with a pending
    edge goes back to ``waiting``, the others to ``queued``, due now. So a step that was
    cancelled because the one before it failed waits for that one's new run, and runs once,
    after it. ``attempts`` as :func:`~sa_jobqueue.ops.requeue_job`: "extend" or "reset".

    Kept as they are (``left``): a job that waits, on a cancelling edge, for a dead or
    cancelled job outside the workflow (nobody retries that one), a job whose unique key a
    live job of its task holds, with "extend" a job that used the largest number of attempts
    there is, and in turn what waits for those on cancelling edges. A
    running job whose cancellation was requested is not finished yet: retry once it ends.
    """
    reset = requeue_resets(attempts)
    conn, checked, rows = _locked(session, workflow_id)
    ended = {row.id: row for row in rows if row.status in (DEAD, CANCELLED)}
    if not ended:
        return WorkflowChange(checked, 0)
    members = {row.id for row in rows}
    edges = [Edge(*r) for r in conn.execute(workflows_sql.edges_from(), {"job_ids": [*ended]})]
    outside = sorted({e.depends_on for e in edges if e.depends_on not in members})
    failed_outside: set[int] = set()
    if outside:
        found = conn.execute(workflows_sql.statuses_of(), {"job_ids": outside})
        failed_outside = {job_id for job_id, status in found if status in (DEAD, CANCELLED)}
    blocked = _keys_in_use(conn, ended)
    if not reset:
        # As requeue: a job that used the largest number of attempts cannot be extended. Left
        # out here, before any edge is made pending for it (its dependents would wait forever).
        blocked |= {job_id for job_id, row in ended.items() if row.attempts >= MAX_ATTEMPTS}
    kept = _kept(ended, edges, failed_outside, blocked)
    retried = sorted(set(ended) - kept)
    waiters = retried + [row.id for row in rows if row.status == WAITING]
    conn.execute(workflows_sql.pend_edges(), {"retried": retried, "waiters": waiters})
    moved = conn.execute(workflows_sql.retry_jobs(reset), {"retried": retried}).all()
    for queue in sorted({row.queue for row in moved if row.status == QUEUED}):
        wake(conn, queue)
    waiting = sum(1 for row in moved if row.status == WAITING)
    return WorkflowChange(checked, len(moved), waiting=waiting, left=len(ended) - len(moved))


def _keys_in_use(conn: Connection, ended: dict[int, Any]) -> set[int]:
    """The ended jobs that cannot go live again for their unique key: held by a live job, or
    by an ended job of the workflow with a lower id (which goes live first)."""
    keyed = [job_id for job_id, row in ended.items() if row.unique_key is not None]
    if not keyed:
        return set()
    held = set(conn.execute(workflows_sql.keys_held_elsewhere(), {"job_ids": keyed}).scalars())
    first: dict[tuple[str, str], int] = {}
    for job_id in sorted(set(keyed) - held):
        key = (ended[job_id].task, ended[job_id].unique_key)
        if key in first:
            held.add(job_id)
        else:
            first[key] = job_id
    return held


def _kept(
    ended: dict[int, Any], edges: Iterable[Edge], failed_outside: set[int], blocked: set[int]
) -> set[int]:
    """The ended jobs a retry leaves as they are: ``blocked`` ones, those that wait on a
    cancelling edge for a failed job outside the workflow, and, in turn, the ended jobs that
    wait on a cancelling edge for one of those (a fixpoint over the edges)."""
    cancelling = [e for e in edges if e.on_failure == "cancel"]
    kept = set(blocked) | {e.job_id for e in cancelling if e.depends_on in failed_outside}
    grown = True
    while grown:
        more = {e.job_id for e in cancelling if e.depends_on in kept and e.job_id in ended}
        grown = not more <= kept
        kept |= more
    return kept


def delete_workflow(
    session: SessionLike, workflow_id: int, *, force: bool = False
) -> WorkflowChange:
    """Delete workflow ``workflow_id``'s jobs and the edges they were made with, in the
    caller's transaction; nothing else (jobs outside it that waited for one of its jobs keep
    their settled edges, as a delete of jobs leaves them).

    Only a finished workflow: while a job of it is waiting, queued or running it raises
    WorkflowNotFinishedError and changes nothing. With ``force`` its waiting and queued jobs
    are cancelled first (what waits for them outside the workflow is settled, as a cancel
    does) and deleted with the rest; a running job still refuses the delete, since a worker
    holds it: cancel the workflow, and delete once its workers have stopped those jobs.
    """
    conn, checked, rows = _locked(session, workflow_id)
    unfinished = [row.id for row in rows if row.status not in FINISHED_STATUSES]
    running = sum(1 for row in rows if row.status == RUNNING)
    if running or (unfinished and not force):
        raise WorkflowNotFinishedError(checked, running or len(unfinished), running=bool(running))
    _cancel(conn, unfinished)
    ids = [row.id for row in rows]
    conn.execute(workflows_sql.delete_edges(), {"job_ids": ids})
    deleted = conn.execute(workflows_sql.delete_jobs(), {"job_ids": ids}).scalars().all()
    return WorkflowChange(checked, len(deleted), left=len(ids) - len(deleted))
