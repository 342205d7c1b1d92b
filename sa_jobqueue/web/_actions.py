"""What the dashboard's buttons do, each in the caller's one transaction, and what to say.

Each function takes a Connection inside a transaction the app begins for the action alone and
commits when the function returns (rolls back if it raises), and returns an :class:`Outcome`
for the page to show. A bulk action changes at most one batch of jobs (:data:`MAX_BATCH`
for a purge, :data:`~sa_jobqueue.ops.requeue.REQUEUE_BATCH` for a retry), so one click never
holds locks for long; its outcome says how many are left for the next click.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final, Literal

from sqlalchemy import Connection

from .._sql import dashboard as dashboard_sql
from .._sql.finished import purge_batch
from ..errors import InvalidLimitError, UnknownWorkflowError, WorkflowNotFinishedError
from ..models import DEAD, PRUNED_STATUSES, RUNNING
from ..ops.admin import cancel_job, get_job, requeue_job
from ..ops.filters import RequeueAttempts, check_age
from ..ops.health import span
from ..ops.queues import (
    QueueLimits,
    RateLimit,
    check_cap,
    pause_queue,
    queue_limits,
    resume_queue,
    set_queue_concurrency,
    set_queue_key_concurrency,
    set_queue_key_rate,
    set_queue_rate,
)
from ..ops.requeue import requeue_dead_jobs
from ..ops.workflows import cancel_workflow, delete_workflow, retry_workflow

#: The most jobs one click purges.
MAX_BATCH: Final = 10_000

Problem = Literal["not_found", "conflict"]


@dataclass(frozen=True)
class Outcome:
    """What an action did, in a sentence; ``ok`` False when it did not do what was asked,
    and then ``problem`` says why in a word the JSON API answers with (its status code)."""

    ok: bool
    text: str
    #: "not_found": no such job; "conflict": its state does not allow the action.
    problem: Problem | None = None


def retry(conn: Connection, job_id: int, attempts: RequeueAttempts) -> Outcome:
    """Put dead job ``job_id`` back in its queue, due now (see :func:`requeue_job`)."""
    if requeue_job(conn, job_id, attempts=attempts):
        return Outcome(True, f"job {job_id} is queued again")
    job = get_job(conn, job_id)
    if job is None:
        return Outcome(False, f"job {job_id}: no such job", "not_found")
    if job.status != DEAD:
        return Outcome(False, f"job {job_id} is {job.status}, not dead: left as it is", "conflict")
    return Outcome(
        False, f"job {job_id} stays dead: a live job of its task holds its unique key", "conflict"
    )


def cancel(conn: Connection, job_id: int) -> Outcome:
    """Cancel a queued job, or ask the worker running it to stop (see :func:`cancel_job`)."""
    if cancel_job(conn, job_id):
        job = get_job(conn, job_id)
        if job is not None and job.status == RUNNING:
            return Outcome(True, f"job {job_id}: cancellation requested; its worker stops it")
        return Outcome(True, f"job {job_id} is cancelled")
    job = get_job(conn, job_id)
    if job is None:
        return Outcome(False, f"job {job_id}: no such job", "not_found")
    return Outcome(False, f"job {job_id} is already {job.status}: left as it is", "conflict")


def workflow_action(
    conn: Connection,
    workflow_id: int,
    action: str,
    attempts: RequeueAttempts = "extend",
    force: bool = False,
) -> Outcome:
    """Cancel, retry or delete workflow ``workflow_id``, all its jobs in this one transaction
    (see :mod:`sa_jobqueue.ops.workflows`)."""
    head = f"workflow {workflow_id}"
    try:
        if action == "cancel":
            done = cancel_workflow(conn, workflow_id)
            return Outcome(
                True,
                f"{head}: {done.changed} job(s) cancelled, cancellation requested of"
                f" {done.requested} running",
            )
        if action == "retry":
            done = retry_workflow(conn, workflow_id, attempts=attempts)
            kept = f"; {done.left} left as they were" if done.left else ""
            return Outcome(
                done.changed > 0 or not done.left,
                f"{head}: {done.changed} job(s) back ({done.waiting} waiting for others){kept}",
            )
        done = delete_workflow(conn, workflow_id, force=force)
        return Outcome(True, f"{head}: {done.changed} job(s) deleted")
    except UnknownWorkflowError:
        return Outcome(False, f"{head}: no such workflow", "not_found")
    except WorkflowNotFinishedError as exc:
        return Outcome(False, str(exc), "conflict")


def pause(conn: Connection, queue: str) -> Outcome:
    """Pause ``queue``: no worker starts its jobs until it is resumed (see :func:`pause_queue`)."""
    if pause_queue(conn, queue):
        return Outcome(True, f"queue {queue} is paused: its running jobs finish, no new one starts")
    return Outcome(True, f"queue {queue} was paused already")


def resume(conn: Connection, queue: str) -> Outcome:
    """Resume ``queue`` and wake its workers at commit (see :func:`resume_queue`)."""
    if resume_queue(conn, queue):
        return Outcome(True, f"queue {queue} is resumed")
    return Outcome(True, f"queue {queue} was not paused")


def retry_matching(
    conn: Connection,
    *,
    queue: str | None,
    task: str | None,
    older_than: timedelta | None,
    attempts: RequeueAttempts,
) -> Outcome:
    """Requeue one batch of dead jobs of the filter, lowest ids first (see
    :func:`~sa_jobqueue.ops.requeue.requeue_dead_jobs`), and count those still dead."""
    done = requeue_dead_jobs(conn, queue=queue, task=task, older_than=older_than, attempts=attempts)
    params: dict[str, Any] = {}
    if queue is not None:
        params["b_queue"] = queue
    if task is not None:
        params["b_task"] = task
    if older_than is not None:
        params["b_older_than"] = check_age(older_than)
    flags = {
        "queue": queue is not None,
        "task": task is not None,
        "older_than": older_than is not None,
    }
    left = conn.execute(dashboard_sql.count_dead(**flags), params).scalar_one()
    text = f"{done.requeued:,} dead job(s) queued again"
    if left:
        text += (
            f"; {left:,} still dead (a live job holds the unique key of some, another"
            " session had some locked, or more matched than one click takes)"
        )
    return Outcome(bool(done.requeued) or not left, text)


def purge(conn: Connection, *, statuses: list[str], older_than: timedelta) -> Outcome:
    """Delete up to :data:`MAX_BATCH` finished jobs of ``statuses`` past ``older_than``."""
    params: dict[str, Any] = {
        "statuses": statuses,
        "older_than": check_age(older_than),
        "batch": MAX_BATCH,
        "after_id": 0,
    }
    deleted = conn.execute(purge_batch(queue=False, task=False), params).all()
    left = count_purge(conn, statuses=statuses, older_than=older_than)
    what = f"{'/'.join(statuses)} job(s) finished over {span(older_than)} ago"
    text = f"purged {len(deleted):,} {what}"
    if left:
        more = f"over {MAX_BATCH:,}" if left > MAX_BATCH else f"{left:,}"
        text += f"; {more} left (purge again to continue)"
    return Outcome(True, text)


def count_purge(conn: Connection, *, statuses: list[str], older_than: timedelta) -> int:
    """How many jobs of ``statuses`` finished over ``older_than`` ago, up to MAX_BATCH + 1.

    One more than a click purges says "more than one click's worth" without counting a
    history of millions. Succeeded and cancelled jobs are counted from the prune index, dead
    ones from the dead index, each count stopping there.
    """
    seconds = check_age(older_than)
    total = 0
    for within, group in (("pruned", PRUNED_STATUSES), ("dead", (DEAD,))):
        wanted = [s for s in statuses if s in group]
        if wanted:
            params = {"statuses": wanted, "older_than": seconds, "upto": MAX_BATCH + 1}
            total += conn.execute(dashboard_sql.count_finished(within), params).scalar_one()
    return min(total, MAX_BATCH + 1)


@dataclass(frozen=True)
class LimitsForm:
    """The queue page's limits as typed: each blank for "none"."""

    concurrency: str = ""
    rate: str = ""
    key_field: str = ""
    key_concurrency: str = ""
    key_rate: str = ""


def set_limits(conn: Connection, queue: str, form: LimitsForm) -> Outcome:
    """Set all four of ``queue``'s limits to those of ``form``, with the functions (and so the
    checks) of ``sa-jobqueue queues limit``; an invalid value raises InvalidLimitError (or
    InvalidNameError) before any SQL, and the transaction is rolled back with nothing changed."""
    cap = _whole(form.concurrency, "cap")
    key_cap = _whole(form.key_concurrency, "cap per key")
    key = form.key_field.strip() or None
    # Checked whole before anything is written (the key field after its limits are cleared
    # below, which the ops functions would otherwise refuse as a second key field).
    check_cap(cap)
    check_cap(key_cap)
    rate = RateLimit.parse(form.rate.strip()) if form.rate.strip() else None
    key_rate = RateLimit.parse(form.key_rate.strip()) if form.key_rate.strip() else None
    before = set_queue_concurrency(conn, queue, cap)
    set_queue_rate(conn, queue, rate)
    # The limits per key share one field: cleared first, so that the form may change it.
    set_queue_key_rate(conn, queue, None)
    set_queue_key_concurrency(conn, queue, None)
    if key_cap is not None:
        set_queue_key_concurrency(conn, queue, key_cap, key=key)
    if key_rate is not None:
        set_queue_key_rate(conn, queue, key_rate, key=key)
    after = queue_limits(conn).get(queue, QueueLimits())
    return Outcome(True, f"queue {queue}: {limits_text(after)} (was: {limits_text(before)})")


def limits_text(limits: QueueLimits) -> str:
    """A queue's limits in words, as the overview writes them (``none`` without any)."""
    words = []
    if limits.concurrency is not None:
        words.append(f"at most {limits.concurrency} running")
    if limits.rate is not None:
        words.append(str(limits.rate))
    if limits.key_concurrency is not None:
        words.append(f"at most {limits.key_concurrency} per {limits.key_field}")
    if limits.key_rate is not None:
        words.append(f"{limits.key_rate} per {limits.key_field}")
    return ", ".join(words) or "no limit"


def _whole(text: str, what: str) -> int | None:
    """A form's whole number, None when blank; InvalidLimitError for other text."""
    text = text.strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise InvalidLimitError(f"a {what} must be a whole number, not {text[:40]!r}") from None
