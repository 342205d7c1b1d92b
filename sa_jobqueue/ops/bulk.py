"""Acting on many jobs: cancel, retry, delete or run now, one bounded batch per call.

The dashboard's "act on many" calls these (one batch per click); each takes either chosen
``ids`` (at most :data:`~sa_jobqueue.ops.filters.MAX_IDS`) or the list's filters (``queue``,
``task``, ``statuses``, ``older_than``), works in the caller's transaction without
committing, and changes at most ``batch`` jobs (:data:`BULK_BATCH`), locking only those.
Each change is a compare-and-set on the job's status: a job that changed state between the
pick and the change, or that another session holds locked (``SKIP LOCKED``), is left as it
was and counted in :attr:`BulkBatch.left`. Bad arguments raise InvalidJobError before any SQL.

What is not promised: every match in one call (``more`` says when to call again), nor a
consistent picture across calls; workers change jobs meanwhile.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from time import monotonic
from typing import Any, Final, Literal

from sqlalchemy import Connection

from .._binds import SessionLike, connection_of
from .._enqueue import wake
from .._sql import bulk as bulk_sql
from .._sql.dashboard import id_range
from ..models import (
    DEAD,
    FINISHED_STATUSES,
    PRUNED_STATUSES,
    QUEUED,
    RUNNING,
    WAITING,
)
from .filters import (
    RequeueAttempts,
    check_after_id,
    check_ids,
    check_limit,
    check_statuses,
    filter_params,
)
from .requeue import requeue_dead_jobs

#: The most jobs one call changes. Cancelling a job settles what waits for it in the same
#: statement (and what waits for those), so a batch can write more rows than it picks; 1,000
#: keeps a batch to a fraction of a second (on the tests' 2 shared cores, over 200,000 jobs:
#: 1,000 cancelled in 50 ms, 1,000 deleted in 20 ms), far below the dashboard's 15 s
#: statement timeout on a much slower server, and the locks brief. (The CLI's retry keeps
#: its own batch, :data:`~sa_jobqueue.ops.requeue.REQUEUE_BATCH`.)
BULK_BATCH: Final = 1_000

#: Ids one statement looks through when no index serves the filter: deleting or counting
#: succeeded and cancelled jobs (the prune index holds only ``finished_at``). A range of the
#: primary key this long takes about 10 ms to read on the tests' cores; 200,000 ids were
#: walked for a rare match (one queue's cancelled jobs) in 0.2 s.
BULK_WINDOW: Final = 20_000
#: How long one call goes on walking windows of ids before it stops and says "more": far
#: below the dashboard's statement timeout (15 s), whatever the history's length. Every
#: statement stays bounded by its window; the locks, by the batch.
WALK_BUDGET: Final = 3.0

Action = Literal["cancel", "retry", "delete", "run_now"]

#: The statuses each action applies to; by filter, cancel reaches queued and running jobs
#: only (the claim index): no index holds waiting jobs, which are cancelled by id.
APPLIES_TO: Final[dict[Action, tuple[str, ...]]] = {
    "cancel": (WAITING, QUEUED, RUNNING),
    "retry": (DEAD,),
    "delete": FINISHED_STATUSES,
    "run_now": (QUEUED,),
}
_BY_FILTER: Final[dict[Action, tuple[str, ...]]] = {**APPLIES_TO, "cancel": (QUEUED, RUNNING)}


@dataclass(frozen=True)
class BulkBatch:
    """What one call did."""

    #: Jobs changed: cancelled, queued again, deleted or made due now.
    done: int
    #: Running jobs whose cancellation was requested (cancel only): their workers end them.
    requested: int
    #: Jobs named or picked and left as they were: in a state the action does not apply to,
    #: changed or locked by someone else meanwhile, or (retry) holding a unique key in use.
    left: int
    #: Whether the batch was full: more jobs may match (call again).
    more: bool
    #: By filter, the highest id the batch picked (None if none): give it as the next call's
    #: ``after_id`` to go on past the jobs this one left (a running job whose cancellation
    #: was requested still matches a cancel, and would be picked again).
    last_id: int | None = None


class _Walk:
    """Windows of :data:`BULK_WINDOW` ids, lowest first, for as long as :data:`WALK_BUDGET`."""

    def __init__(self, conn: Connection) -> None:
        lowest, highest = conn.execute(id_range()).one()
        self.position = 0 if lowest is None else lowest - 1
        self.highest = 0 if highest is None else highest
        self.deadline = monotonic() + WALK_BUDGET

    @property
    def finished(self) -> bool:
        """Whether the walk went past the highest id."""
        return self.position >= self.highest

    def windows(self) -> Iterator[int]:
        """Where each window starts (past that id), until the end or the budget."""
        while not self.finished and monotonic() < self.deadline:
            yield self.position
            self.position += BULK_WINDOW

    @staticmethod
    def params(start: int) -> dict[str, int]:
        return {"b_after_id": start, "b_until": start + BULK_WINDOW}


@dataclass(frozen=True)
class _Selection:
    params: dict[str, Any]
    flags: dict[str, bool]
    statuses: list[str]
    named: int


def _select(
    action: Action,
    ids: Collection[int] | None,
    queue: str | None,
    task: str | None,
    statuses: Iterable[str] | None,
    older_than: timedelta | None,
    batch: int,
    after_id: int = 0,
) -> _Selection:
    """The checked parameters of a call: the statuses it may change (the action's, narrowed
    by ``statuses``) and the ids or filters that choose the jobs."""
    params: dict[str, Any] = {
        "b_batch": check_limit(batch, "batch"),
        "b_after_id": check_after_id(after_id),
    }
    wanted = APPLIES_TO[action] if ids is not None else _BY_FILTER[action]
    if statuses is not None:
        given = check_statuses(list(statuses))
        wanted = tuple(s for s in wanted if s in given)
    named = 0
    if ids is not None:
        params["b_ids"] = check_ids(ids)
        named = len(params["b_ids"])
    chosen, flags = filter_params(queue, task, older_than)
    params.update(chosen)
    return _Selection(params, flags, list(wanted), named)


def _outcome(
    sel: _Selection, picked: int, done: int, requested: int = 0, last_id: int | None = None
) -> BulkBatch:
    seen = sel.named or picked
    more = not sel.named and picked == sel.params["b_batch"]
    left = seen - done - requested
    last = None if sel.named else last_id  # by ids, there is no next call to start
    return BulkBatch(done=done, requested=requested, left=left, more=more, last_id=last)


def cancel_jobs(
    session: SessionLike,
    *,
    ids: Collection[int] | None = None,
    queue: str | None = None,
    task: str | None = None,
    statuses: Iterable[str] | None = None,
    older_than: timedelta | None = None,
    batch: int = BULK_BATCH,
    after_id: int = 0,
) -> BulkBatch:
    """Cancel up to ``batch`` jobs, lowest ids first, as :func:`~.admin.cancel_job` does each.

    A waiting or queued job ends ``cancelled`` (what waits for it is settled, as when any job
    ends); a running one has its cancellation requested and its worker ends it. Finished
    jobs are left as they are. By filter, waiting jobs are not reached (see
    :data:`APPLIES_TO`), and only ids above ``after_id`` are (see :attr:`BulkBatch.last_id`).
    """
    sel = _select("cancel", ids, queue, task, statuses, older_than, batch, after_id)
    if not sel.statuses:
        return _outcome(sel, 0, 0)
    sel.params["b_statuses"] = sel.statuses
    statement = bulk_sql.cancel_batch(ids=ids is not None, **sel.flags)
    rows = connection_of(session).execute(statement, sel.params).all()
    cancelled = sum(1 for row in rows if row.cancelled)
    requested = sum(1 for row in rows if row.requested)
    last = rows[-1].id if rows else None
    return _outcome(sel, len(rows), cancelled, requested, last)


def retry_jobs(
    session: SessionLike,
    *,
    ids: Collection[int] | None = None,
    queue: str | None = None,
    task: str | None = None,
    statuses: Iterable[str] | None = None,
    older_than: timedelta | None = None,
    attempts: RequeueAttempts = "extend",
    batch: int = BULK_BATCH,
) -> BulkBatch:
    """Queue up to ``batch`` dead jobs again, due now: :func:`~.requeue.requeue_dead_jobs`.

    Only dead jobs: a cancelled job was stopped on purpose, and ``requeue`` refuses it too. A
    dead job whose unique key a live job of its task holds stays dead (``left``).
    """
    sel = _select("retry", ids, queue, task, statuses, older_than, batch)
    if not sel.statuses:
        return _outcome(sel, 0, 0)
    done = requeue_dead_jobs(
        session,
        queue=queue,
        task=task,
        older_than=older_than,
        attempts=attempts,
        batch=batch,
        ids=sel.params.get("b_ids"),
    )
    return _outcome(sel, done.requeued + done.kept, done.requeued)


def delete_jobs(
    session: SessionLike,
    *,
    ids: Collection[int] | None = None,
    queue: str | None = None,
    task: str | None = None,
    statuses: Iterable[str] | None = None,
    older_than: timedelta | None = None,
    batch: int = BULK_BATCH,
) -> BulkBatch:
    """Delete up to ``batch`` finished jobs (succeeded, dead, cancelled), with their results.

    Never a waiting, queued or running job: a worker may be running it, or other jobs wait
    for it, and deleting it would lose work nobody chose to drop (cancel it first). As with
    ``purge``, the job's dependency edges stay: a finished job's edges are settled, and the
    workers' pruning deletes settled edges whose waiting job is gone.
    """
    sel = _select("delete", ids, queue, task, statuses, older_than, batch)
    conn = connection_of(session)
    if ids is not None:
        if not sel.statuses:
            return _outcome(sel, 0, 0)
        sel.params["b_statuses"] = sel.statuses
        rows = conn.execute(bulk_sql.delete_batch(None, ids=True, **sel.flags), sel.params).all()
        return _outcome(sel, len(rows), sum(1 for row in rows if row.deleted))
    # By filter, succeeded and cancelled jobs window by window, then dead ones from their
    # index, the batch shared between them.
    picked = deleted = 0
    more = False
    pruned = [s for s in sel.statuses if s in PRUNED_STATUSES]
    if pruned:
        statement = bulk_sql.delete_batch("pruned", ids=False, **sel.flags)
        walk = _Walk(conn)
        for start in walk.windows():
            params = {**sel.params, "b_statuses": pruned, "b_batch": batch - picked}
            rows = conn.execute(statement, {**params, **walk.params(start)}).all()
            picked += len(rows)
            deleted += sum(1 for row in rows if row.deleted)
            if picked == batch:
                break
        more = picked == batch or not walk.finished
    if DEAD in sel.statuses and picked < batch:
        params = {**sel.params, "b_statuses": [DEAD], "b_batch": batch - picked}
        rows = conn.execute(bulk_sql.delete_batch("dead", ids=False, **sel.flags), params).all()
        picked += len(rows)
        deleted += sum(1 for row in rows if row.deleted)
        more = more or len(rows) == params["b_batch"]
    return BulkBatch(done=deleted, requested=0, left=picked - deleted, more=more)


def run_jobs_now(
    session: SessionLike,
    *,
    ids: Collection[int] | None = None,
    queue: str | None = None,
    task: str | None = None,
    statuses: Iterable[str] | None = None,
    older_than: timedelta | None = None,
    batch: int = BULK_BATCH,
    after_id: int = 0,
) -> BulkBatch:
    """Make up to ``batch`` queued jobs that are due later due now, and wake their queues'
    workers at commit (by filter, only ids above ``after_id``).

    Only queued jobs: a running job's ``visible_at`` is its lease, and a waiting job starts
    when its dependencies let it. A queued job already due is left as it is. Not promised:
    that it runs at once; the queue's limits, pause and priorities still apply.
    """
    sel = _select("run_now", ids, queue, task, statuses, older_than, batch, after_id)
    if not sel.statuses:
        return _outcome(sel, 0, 0)
    sel.params["b_statuses"] = sel.statuses
    conn = connection_of(session)
    rows = conn.execute(bulk_sql.run_now_batch(ids=ids is not None, **sel.flags), sel.params)
    picked = rows.all()
    for name in sorted({q for _, q in picked if q is not None}):
        wake(conn, name)
    moved = sum(1 for _, q in picked if q is not None)
    return _outcome(sel, len(picked), moved, last_id=picked[-1][0] if picked else None)


def count_matching(
    session: SessionLike,
    action: Action,
    *,
    queue: str | None = None,
    task: str | None = None,
    statuses: Iterable[str] | None = None,
    older_than: timedelta | None = None,
    upto: int = 10_000,
) -> int:
    """How many jobs of the filters ``action`` would go through now, counting no further
    than ``upto`` + 1 (one more says "over ``upto``" without counting a history of millions).

    Succeeded and cancelled jobs are counted window by window of ids, as a delete goes
    through them; on a history too long to walk in :data:`WALK_BUDGET` the count is of the
    ids walked (the lowest), fewer than match.
    """
    sel = _select(action, None, queue, task, statuses, older_than, BULK_BATCH)
    limit = check_limit(upto, "upto") + 1
    conn = connection_of(session)
    groups: list[tuple[bulk_sql.Within, list[str]]]
    if action == "delete":
        groups = [
            ("pruned", [s for s in sel.statuses if s in PRUNED_STATUSES]),
            ("dead", [s for s in sel.statuses if s == DEAD]),
        ]
    else:
        groups = [("dead" if action == "retry" else "live", sel.statuses)]
    total = 0
    for within, wanted in groups:
        if not wanted:
            continue
        statement = bulk_sql.count_matching(within, later=action == "run_now", **sel.flags)
        params = {**sel.params, "b_statuses": wanted}
        if within != "pruned":
            total += conn.execute(statement, {**params, "upto": limit}).scalar_one()
            continue
        walk = _Walk(conn)
        for start in walk.windows():
            found = {**params, **walk.params(start), "upto": limit - total}
            total += conn.execute(statement, found).scalar_one()
            if total >= limit:
                break
    return min(total, limit)
