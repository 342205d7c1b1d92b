"""The runner without a worker: one job thread settles each kind of ending, in this thread."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from sa_jobqueue import Discard, JobContext, JobQueue, Retry
from sa_jobqueue._sql import claiming
from sa_jobqueue.models import Job
from sa_jobqueue.observability import Observers
from sa_jobqueue.ops.admin import cancel_job
from sa_jobqueue.worker._attempt import Pipeline
from sa_jobqueue.worker._claimed import Claimed
from sa_jobqueue.worker._groups import Groups
from sa_jobqueue.worker._lanes import Intake, Lane
from sa_jobqueue.worker._leases import LeaseTable
from sa_jobqueue.worker._recorder import Recorder
from sa_jobqueue.worker._reports import Reports
from sa_jobqueue.worker._runner import Runner
from tests.helpers.observers import Outcomes

NOTES = sa.table("notes", sa.column("job_id", sa.BigInteger))


#: The table the handlers write, created by the tier's ``db`` fixture.
TABLES = "CREATE TABLE notes (job_id bigint PRIMARY KEY)"


def note(ctx: JobContext) -> None:
    ctx.session.execute(NOTES.insert().values(job_id=ctx.job_id))


def cancel(db: sa.Engine, job_id: int) -> None:
    """Cancel a running job the way an application does, committed at once."""
    with Session(db) as session:
        assert cancel_job(session, job_id)
        session.commit()


def make_queue(db: sa.Engine) -> JobQueue:
    queue = JobQueue()

    @queue.task
    def writes(ctx: JobContext, payload: Any) -> None:
        note(ctx)

    @queue.task
    def writes_then_fails(ctx: JobContext, payload: Any) -> None:
        note(ctx)
        raise ValueError("after writing")

    @queue.task
    def snoozes(ctx: JobContext, payload: Any) -> None:
        note(ctx)
        raise Retry()

    @queue.task
    def loses_its_lease(ctx: JobContext, payload: Any) -> None:
        note(ctx)
        with db.begin() as conn:  # another worker takes the job over meanwhile
            conn.execute(sa.update(Job).where(Job.id == ctx.job_id).values(attempts=2))

    @queue.task
    def is_cancelled(ctx: JobContext, payload: Any) -> None:
        note(ctx)
        with db.begin() as conn:
            conn.execute(sa.update(Job).where(Job.id == ctx.job_id).values(cancel_requested=True))

    @queue.task
    def quiet(ctx: JobContext, payload: Any) -> None:
        pass

    # Each ends its attempt its own way after its job's cancellation was committed.
    @queue.task
    def cancelled_then_discards(ctx: JobContext, payload: Any) -> None:
        note(ctx)
        cancel(db, ctx.job_id)
        raise Discard("no point going on")

    @queue.task
    def cancelled_then_snoozes(ctx: JobContext, payload: Any) -> None:
        note(ctx)
        cancel(db, ctx.job_id)
        raise Retry()

    @queue.task(max_attempts=3)
    def cancelled_then_fails(ctx: JobContext, payload: Any) -> None:
        note(ctx)
        cancel(db, ctx.job_id)
        raise ValueError("attempts left")

    @queue.task(max_attempts=1)
    def cancelled_then_fails_last(ctx: JobContext, payload: Any) -> None:
        note(ctx)
        cancel(db, ctx.job_id)
        raise ValueError("no attempts left")

    @queue.task
    def cancelled_then_returns(ctx: JobContext, payload: Any) -> None:
        note(ctx)
        cancel(db, ctx.job_id)

    return queue


def run(
    db: sa.Engine,
    queue: JobQueue,
    tasks: list[str],
    rename: dict[str, str] | None = None,
    claimed: Callable[[list[int]], None] | None = None,
) -> tuple[dict[str, str], Outcomes]:
    """Enqueue one job per task, claim them all, and run them on one job thread, in order.

    ``rename`` changes tasks' names in the table after enqueueing (to ones nobody registered).
    ``claimed`` is called with the jobs' ids once they are claimed, before any of them runs.
    """
    with Session(db) as session, session.begin():
        ids = [queue.enqueue(session, task) for task in tasks]
        for old, new in (rename or {}).items():
            session.execute(sa.update(Job).where(Job.task == old).values(task=new))
    outcomes = Outcomes()
    leases = LeaseTable()
    recorder = Recorder(
        db.execution_options(isolation_level="AUTOCOMMIT"), Reports(Observers([outcomes]))
    )
    wake, stopping = threading.Event(), threading.Event()
    runner = Runner(
        queue,
        db,
        leases,
        recorder,
        Pipeline(queue, leases, recorder),
        Groups(db, leases, recorder, wake),
        loop=None,
        stopping=stopping,
        wake=wake,
        intake=Intake(),
    )
    lane = Lane(["default"], 1, len(tasks))
    with db.begin() as conn:
        rows = conn.execute(
            claiming.claim(), {"from_queue": "default", "limit": len(tasks), "worker": "w"}
        ).all()
    if claimed is not None:
        claimed(ids)
    for job in sorted((Claimed.of(row) for row in rows), key=lambda j: ids.index(j.id)):
        runner.submit(lane, job)
    lane.finish_threads()  # one thread: it ends once it has run them all
    runner.thread(lane)  # runs them all, then ends
    recorder.close()
    assert lane.held == 0
    assert leases.snapshot() == {}
    with Session(db) as session:
        status = {job.id: job.status for job in session.scalars(sa.select(Job))}
    return {task: status[job_id] for task, job_id in zip(tasks, ids, strict=True)}, outcomes


def notes(db: sa.Engine) -> set[int]:
    with db.connect() as conn:
        return set(conn.execute(sa.select(NOTES.c.job_id)).scalars())


def test_each_ending_is_settled_and_only_a_success_keeps_its_writes(db: sa.Engine) -> None:
    queue = make_queue(db)
    tasks = ["writes", "writes_then_fails", "snoozes", "loses_its_lease", "is_cancelled", "quiet"]
    status, outcomes = run(db, queue, tasks)
    assert status == {
        "writes": "succeeded",
        "writes_then_fails": "queued",
        "snoozes": "queued",
        "loses_its_lease": "running",  # the other worker's now
        "is_cancelled": "cancelled",
        "quiet": "succeeded",
    }
    with Session(db) as session:
        written = {job.task: job.id for job in session.scalars(sa.select(Job))}
    assert notes(db) == {written["writes"]}
    assert sorted(outcome for _, outcome in outcomes.seen) == sorted(
        ["succeeded", "retried", "retried", "lost", "cancelled", "succeeded"]
    )


def test_fast_writing_jobs_share_a_group_and_all_commit(db: sa.Engine) -> None:
    queue = make_queue(db)
    status, outcomes = run(db, queue, ["writes"] * 5)
    assert set(status.values()) == {"succeeded"}
    assert len(notes(db)) == 5
    assert [outcome for _, outcome in outcomes.seen] == ["succeeded"] * 5


def test_an_unknown_task_is_a_failed_attempt_and_its_neighbours_run(db: sa.Engine) -> None:
    """A task the worker does not know fails its attempt, retried later (a rolling deploy's
    newer worker may know it); the jobs around it run as usual."""
    queue = make_queue(db)
    status, outcomes = run(db, queue, ["quiet", "writes"], rename={"quiet": "gone"})
    assert status == {"quiet": "queued", "writes": "succeeded"}
    with Session(db) as session:
        failed = session.scalars(sa.select(Job).where(Job.task == "gone")).one()
        assert failed.last_error["type"] == "sa_jobqueue.errors.UnknownTaskError"
        assert failed.attempts == 1
    assert sorted(outcome for _, outcome in outcomes.seen) == ["retried", "succeeded"]


def test_every_ending_of_an_attempt_after_its_cancel_is_cancelled(db: sa.Engine) -> None:
    """Once a running job's cancellation is committed, its attempt ends it cancelled whatever
    its handler does (returns, Discard, Retry, fails with or without attempts left), and so
    does an unknown task's; what waits for each is settled as for a cancellation."""
    queue = make_queue(db)
    tasks = [
        "cancelled_then_discards",
        "cancelled_then_snoozes",
        "cancelled_then_fails",
        "cancelled_then_fails_last",
        "cancelled_then_returns",
        "quiet",  # renamed: a task nobody registered, cancelled before it runs
    ]
    followers: list[int] = []

    def cancel_unknown_and_follow(ids: list[int]) -> None:
        cancel(db, ids[-1])
        with Session(db) as session, session.begin():
            followers.extend(queue.enqueue(session, "quiet", depends_on=[i]) for i in ids)

    status, outcomes = run(db, queue, tasks, {"quiet": "gone"}, cancel_unknown_and_follow)
    assert status == dict.fromkeys(tasks, "cancelled")
    assert notes(db) == set()
    with db.connect() as conn:
        after = conn.execute(sa.select(Job.status).where(Job.id.in_(followers))).scalars().all()
    assert after == ["cancelled"] * len(tasks)
    assert [outcome for _, outcome in outcomes.seen] == ["cancelled"] * len(tasks)
