"""The ends of a running attempt, each fenced on the attempt that claimed the job."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from functools import cache
from typing import Any, Final

from sqlalchemy import (
    ColumnElement,
    DateTime,
    Select,
    Text,
    Update,
    bindparam,
    case,
    cast,
    func,
    literal,
    null,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB

from ..models import (
    CANCELLED,
    DEAD,
    QUEUED,
    SUCCEEDED,
    jobs_table,
)
from .attempt_history import appended
from .clock import seconds
from .dependencies import settle, settled_here, settling
from .fence import fenced, fenced_many, held_ids, held_many

j = jobs_table.c

#: The outcomes an entry of ``attempt_history`` may name besides ``dead`` and ``cancelled``:
#: failed and to run again; run again by a handler's ``Retry``; stopped part-way (by the
#: worker's shutdown, or a group's rollback that was no fault of its own) and run again.
RETRIED: Final = "retried"
SNOOZED: Final = "snoozed"
RELEASED: Final = "released"


@cache
def complete() -> Update:
    """Mark one attempt succeeded; zero rows means it is stale or its job is being cancelled.

    A job whose cancellation was requested while it ran does not complete: its handler's
    writes roll back and :func:`finish_cancelled` ends it instead.
    """
    return fenced(
        update(jobs_table)
        .where(j.cancel_requested.is_(False))
        # statement_timestamp(), not now(): this runs in the handler's transaction, whose
        # now() is the moment the handler first touched the database.
        .values(
            status=SUCCEEDED,
            finished_at=func.statement_timestamp(),
            visible_at=func.statement_timestamp(),
            # ``:result``, the handler's return value as JSON text, for a task that keeps it.
            result=cast(bindparam("result", value=None, type_=Text), JSONB),
        )
        .returning(_notified(), settled_here())
    )


#: The channel a stored result is announced on (its job's id as the payload), at commit:
#: what ``wait_for_result`` listens to. Workers do not listen to it.
RESULTS_CHANNEL: Final = "sa_jobqueue_results"


def _notified() -> ColumnElement[Any]:
    """A RETURNING column that announces the row's result, if it has one, at commit."""
    announce = func.pg_notify(literal(RESULTS_CHANNEL), cast(j.id, Text))
    return case((j.result.is_not(None), announce), else_=null()).label("notified")


@cache
def complete_many() -> Select[Any]:
    """:func:`complete` for many attempts in one statement; returns the ids it completed.

    Their dependents are settled once for the whole batch (see ``dependencies.settling``).
    """
    return settling(complete_many_update())


@cache
def complete_many_unless_locked() -> Select[Any]:
    """:func:`complete_many` that never waits for another transaction's row lock.

    A claim whose snapshot still saw a job as queued, and that reached it just after another
    worker's claim of it committed, locks the job's newest version and keeps that lock, though
    it then skips the row, until it commits (READ COMMITTED's recheck of an updated row, for
    ``FOR UPDATE`` and ``UPDATE`` alike). A completion that came right behind its own claim
    would wait for that stranger's claim to end. Here the rows of ``:job_ids`` are locked
    ``SKIP LOCKED`` first, and only those locked are completed, as :func:`complete_many`
    completes them (fenced). One row: ``done``, the ids completed; ``locked``, the ids locked
    (one locked and not done is stale or cancelled, as one :func:`complete_many` does not
    complete); an id of ``:job_ids`` in neither was held by another transaction, and is to be
    tried again.
    """
    locked = (
        select(j.id)
        .where(held_ids())
        .with_for_update(key_share=True, skip_locked=True)  # FOR NO KEY UPDATE SKIP LOCKED
        .cte("locked")
        .prefix_with("MATERIALIZED")
    )
    # ``= ANY (ARRAY(...))``, not ``IN (SELECT ...)``: with the planner's estimate of one
    # running row, a semi join read the locked rows once per row, n x n comparisons.
    mine = func.array(select(locked.c.id).scalar_subquery())
    ended = complete_many_update(j.id == func.any(mine)).cte("ended")
    return select(
        func.array(select(ended.c.id).scalar_subquery()).label("done"),
        mine.label("locked"),
        # Read, so that each row's announcement is evaluated whatever the plan.
        select(func.count(cast(ended.c.notified, Text))).scalar_subquery().label("notified"),
        settle(ended).label("settled"),
    )


def complete_many_update(rows: ColumnElement[bool] | None = None) -> Update:
    """:func:`complete_many`'s UPDATE alone (RETURNING ``id``, ``status``, ``notified``), for a
    statement that settles the dependents itself; ``rows`` as :func:`.fence.fenced_many`
    takes it."""
    return (
        update(jobs_table)
        .where(*fenced_many(rows), j.cancel_requested.is_(False))
        .values(
            status=SUCCEEDED,
            finished_at=func.statement_timestamp(),
            visible_at=func.statement_timestamp(),
            # ``:results``: a JSON object from job id to result, for the jobs that keep one.
            result=cast(bindparam("results", value="{}", type_=Text), JSONB).op("->")(
                cast(j.id, Text)
            ),
        )
        .returning(j.id, j.status, _notified())
    )


@cache
def release() -> Update:
    """Hand claimed attempts that never started back to the queue, as if never claimed.

    Used on shutdown for jobs still waiting in the worker's buffer: the attempt is not counted
    and the job takes back its place in the claim order, its ``visible_at`` as it was before
    the claim (``:due_list``, a JSON object from job id to that time, as the claim returned
    it). Due at once (``now()``) where ``:due_list`` has no time for it. Given ``now()``
    instead, a rolling restart would send each worker's buffered jobs behind the jobs
    enqueued after them: in a queue with a cap of 1 per key, after their keys' later jobs.
    Fenced like every transition.
    """
    due_before = cast(
        cast(bindparam("due_list", value="{}", type_=Text), JSONB).op("->>")(cast(j.id, Text)),
        DateTime(timezone=True),
    )
    return (
        update(jobs_table)
        .where(*fenced_many())
        .values(
            # A job cancelled while it waited in the buffer ends here rather than run again.
            status=case((j.cancel_requested, CANCELLED), else_=QUEUED),
            attempts=j.attempts - 1,
            visible_at=func.coalesce(due_before, func.now()),
            started_at=None,
            finished_at=case((j.cancel_requested, func.now()), else_=None),
            worker=None,
        )
        .returning(j.id, settled_here())
    )


def release_params(held: Iterable[tuple[int, int, datetime | None]]) -> dict[str, Any]:
    """The parameters of :func:`release` for ``(job id, attempt, visible_at before the claim)``
    triples, as the claim returned them (None: due at once)."""
    held = list(held)
    due = {job_id: moment.isoformat() for job_id, _, moment in held if moment is not None}
    return {
        **held_many((job_id, attempt) for job_id, attempt, _ in held),
        "due_list": json.dumps(due),
    }


@cache
def release_ran() -> Update:
    """Hand attempts whose handlers ran back to the queue, due now, their attempts not spent.

    For the jobs of a group whose shared transaction rolled back through no fault of theirs
    (a sibling lost its lease, the transaction ended early): their writes went with it, so
    they must run again. As :func:`release_stopped` does for one job, each attempt keeps its
    number (handed back with ``attempts - 1``, the next claim would run that number a second
    time, and two runs would share one fence) and ``max_attempts`` grows by one. A job whose
    cancellation was requested ends ``cancelled``. Fenced like every transition.
    """
    return (
        update(jobs_table)
        .where(*fenced_many())
        .values(**_requeued(func.now(), j.max_attempts + 1, RELEASED))
        .returning(j.id, settled_here())
    )


@cache
def finish_cancelled() -> Update:
    """End one attempt whose job's cancellation was requested as ``cancelled``."""
    return fenced(
        update(jobs_table)
        .where(j.cancel_requested.is_(True))
        .values(
            status=CANCELLED,
            finished_at=func.now(),
            worker=None,
            attempt_history=appended(literal(CANCELLED), None),
        )
        .returning(settled_here())
    )


@cache
def fail() -> Update:
    """Record a failed attempt: ``queued`` again ``:delay`` seconds on, or ``dead`` if exhausted.

    A job whose cancellation was requested ends ``cancelled`` instead of being retried.

    ``:error`` is the error as JSON text. Returns the new status, or no row if stale.
    """
    exhausted = or_(j.attempts >= j.max_attempts, j.cancel_requested)
    error = cast(bindparam("error", type_=Text), JSONB)
    outcome = case((j.cancel_requested, CANCELLED), (exhausted, DEAD), else_=RETRIED)
    return fenced(
        update(jobs_table)
        .values(
            status=case((j.cancel_requested, CANCELLED), (exhausted, DEAD), else_=QUEUED),
            visible_at=func.now() + seconds("delay"),
            finished_at=case((exhausted, func.now()), else_=None),
            last_error=error,
            attempt_history=appended(outcome, error),
            worker=None,
        )
        .returning(j.status, j.visible_at, settled_here())
    )


@cache
def snooze() -> Update:
    """Put a running attempt's job back in the queue ``:delay`` seconds on, with no error.

    What a handler's ``Retry`` does. The attempt stays counted (attempts are counted when
    claimed), so that ``attempts`` still names one attempt for the fence; ``max_attempts``
    grows by one when none would be left, so a job cannot run out of attempts by retrying.
    A job whose cancellation was requested ends ``cancelled`` instead. Returns the new status
    and due time, or no row if stale.
    """
    return _requeue(
        func.now() + seconds("delay"), func.greatest(j.max_attempts, j.attempts + 1), SNOOZED
    )


@cache
def release_stopped() -> Update:
    """Put a running attempt's job back in the queue, due now, its attempt not spent.

    What a handler that raised after its worker's shutdown asked it to stop gets. The
    attempt keeps its number, so ``attempts`` still names this attempt alone for the fence
    (handing it back with ``attempts - 1`` would let the next claim reuse the number), and
    ``max_attempts`` grows by one instead, so the job's budget is not spent on a shutdown.
    A job whose cancellation was requested ends ``cancelled`` instead. Returns the new status
    and due time, or no row if stale.
    """
    return _requeue(func.now(), j.max_attempts + 1, RELEASED)


def _requeue(due: ColumnElement[Any], max_attempts: ColumnElement[int], outcome: str) -> Update:
    """A running attempt's job queued again at ``due`` with no error (cancelled instead if
    its cancellation was requested), fenced; returns its status and due time."""
    return fenced(
        update(jobs_table)
        .values(**_requeued(due, max_attempts, outcome))
        .returning(j.status, j.visible_at, settled_here())
    )


def _requeued(
    due: ColumnElement[Any], max_attempts: ColumnElement[int], outcome: str
) -> dict[str, Any]:
    """The new values of a running attempt's job queued again at ``due`` with no error, its
    attempt kept (``cancelled`` instead if its cancellation was requested), the attempt's
    entry in its history saying ``outcome``."""
    cancelled = j.cancel_requested
    return {
        "status": case((cancelled, CANCELLED), else_=QUEUED),
        "visible_at": due,
        "finished_at": case((cancelled, func.now()), else_=None),
        "max_attempts": max_attempts,
        "worker": None,
        "attempt_history": appended(case((cancelled, CANCELLED), else_=outcome), None),
    }


@cache
def bury() -> Update:
    """Move one attempt's job straight to ``dead`` (Discard, unknown task, undecodable job).

    A job whose cancellation was requested ends ``cancelled`` instead, as on every other end
    of a running attempt but a success that committed before the request; ``:error`` is kept
    in ``last_error`` either way. Returns the new status, or no row if stale.
    """
    error = cast(bindparam("error", type_=Text), JSONB)
    return fenced(
        update(jobs_table)
        .values(
            status=case((j.cancel_requested, CANCELLED), else_=DEAD),
            finished_at=func.now(),
            last_error=error,
            attempt_history=appended(case((j.cancel_requested, CANCELLED), else_=DEAD), error),
            worker=None,
        )
        .returning(j.status, settled_here())
    )
