"""Batch tasks with real workers: batches formed, written once, settled per job.

The handlers are in :mod:`tests.apps.batches`: ``batch_rows`` (no key on ``job_id``) holds one
row per job a batch succeeded, so a count of its rows per job shows whether a batch's writes
committed once, never, or twice.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from sa_jobqueue import BatchContext, BatchJob, JobQueue, Worker
from sa_jobqueue.database import HeldConnection
from sa_jobqueue.middleware import Middleware
from sa_jobqueue.models import Job
from sa_jobqueue.testing import drain
from tests.apps import batches
from tests.apps.batches import async_queue, queue
from tests.helpers.observers import Outcomes
from tests.helpers.processes import WorkerApp, Workers
from tests.helpers.waiting import running, wait_for

WORKER_APP = WorkerApp("tests.apps.batches:queue", log_level="INFO")
TABLES = batches.metadata


def enqueue(
    engine: sa.Engine, task: str, payloads: list[dict[str, Any]], on: JobQueue = queue
) -> list[int]:
    with Session(engine) as session, session.begin():
        return [int(e) for e in on.enqueue_many(session, task, payloads)]


def rows_per_job(engine: sa.Engine) -> dict[int, int]:
    r = batches.rows.c
    with engine.connect() as conn:
        found = conn.execute(sa.select(r.job_id, sa.func.count()).group_by(r.job_id))
        return {job_id: n for job_id, n in found}


def batch_sizes(engine: sa.Engine) -> dict[int, int]:
    r = batches.rows.c
    with engine.connect() as conn:
        return dict(conn.execute(sa.select(r.job_id, r.batch_size)).all())


def statuses(engine: sa.Engine) -> dict[int, str]:
    with Session(engine) as session:
        return {job.id: job.status for job in session.scalars(sa.select(Job))}


def runs_of(engine: sa.Engine) -> list[tuple[int, int]]:
    r = batches.runs.c
    with engine.connect() as conn:
        return [(row.job_id, row.attempt) for row in conn.execute(sa.select(r.job_id, r.attempt))]


def test_a_drain_runs_jobs_in_batches_and_writes_each_once(db: sa.Engine) -> None:
    ids = enqueue(db, "write_rows", [{} for _ in range(120)])
    payloads = [{"tenant": t} for t in ["a", "b", "a", "c", "b", "a"]] + [{}]
    keyed = enqueue(db, "per_tenant", payloads)
    result = drain(queue, db)
    assert result.succeeded == 127
    assert rows_per_job(db) == dict.fromkeys(ids + keyed, 1)
    sizes = batch_sizes(db)
    # max_size is 50: three batches, the first two full.
    assert sorted({sizes[i] for i in ids}) == [20, 50]
    # A batch key keeps each batch to one tenant (a job without the field: its own batch).
    by_tenant = {p.get("tenant"): sizes[i] for i, p in zip(keyed, payloads, strict=True)}
    assert by_tenant == {"a": 3, "b": 2, "c": 1, None: 1}


def test_jobs_marked_alone_follow_their_verdict_while_the_rest_succeed(db: sa.Engine) -> None:
    verdicts = [{}, {"verdict": "fail"}, {"verdict": "retry"}, {"verdict": "discard"}, {}]
    ids = enqueue(db, "write_rows", verdicts)
    drain(queue, db)
    with Session(db) as session:
        jobs = {job.id: job for job in session.scalars(sa.select(Job))}
    assert [jobs[i].status for i in ids] == ["succeeded", "queued", "queued", "dead", "succeeded"]
    assert jobs[ids[1]].last_error is not None
    assert "asked to fail" in str(jobs[ids[1]].last_error)
    assert jobs[ids[2]].last_error is None  # a Retry records no error
    assert "asked to discard" in str(jobs[ids[3]].last_error)
    assert rows_per_job(db) == {ids[0]: 1, ids[4]: 1}


def test_a_raising_batch_fails_every_job_and_writes_nothing(db: sa.Engine) -> None:
    ids = enqueue(db, "write_rows", [{}, {"raise": True}, {}])
    result = drain(queue, db)
    assert result.failed == 3
    assert rows_per_job(db) == {}
    with Session(db) as session:
        jobs = list(session.scalars(sa.select(Job).where(Job.id.in_(ids))))
    assert {(job.status, job.attempts) for job in jobs} == {("queued", 1)}
    assert all("the batch failed" in str(job.last_error) for job in jobs)


def test_an_async_batch_handler_writes_through_its_async_session(db: sa.Engine) -> None:
    ids = enqueue(db, "async_rows", [{} for _ in range(30)], on=async_queue)
    assert drain(async_queue, db).succeeded == 30
    assert rows_per_job(db) == dict.fromkeys(ids, 1)
    with db.connect() as conn:
        result = async_queue.get_result(conn, ids[7])
    assert result is not None
    assert result.value == ids[7]
    assert sorted(set(batch_sizes(db).values())) == [10, 20]


def test_a_stale_member_makes_the_batch_commit_nothing(db: sa.Engine, tmp_path: Path) -> None:
    hold = tmp_path / "go"
    ids = enqueue(db, "write_rows", [{"hold": str(hold)}] + [{} for _ in range(4)])
    outcomes = Outcomes()
    worker = Worker(
        queue,
        db,
        concurrency=1,
        prefetch=0,
        poll_interval=timedelta(milliseconds=100),
        observers=[outcomes],
    )
    with running(worker):
        # The batch has written its rows (uncommitted) and waits.
        wait_for(lambda: len(runs_of(db)) == 5, timeout=20)
        # Another worker's claim of one member, as the database would record it: the attempt
        # moves on, so this batch's attempt of it is stale.
        with db.begin() as conn:
            conn.execute(
                sa.update(Job)
                .where(Job.id == ids[2])
                .values(attempts=Job.attempts + 1, visible_at=sa.func.now())
            )
        hold.touch()
        # The stale member runs again once its lease (2 s) has expired.
        wait_for(lambda: set(statuses(db).values()) == {"succeeded"}, timeout=30)
    # The first batch committed none of its rows: every job's row is there once.
    assert rows_per_job(db) == dict.fromkeys(ids, 1)
    assert len(runs_of(db)) >= 10  # each job ran again after the rollback
    # Observers (metrics, logs) hear of each job: the stale one lost, the others handed back,
    # then each succeeded.
    assert (ids[2], "lost") in outcomes.seen
    assert {(i, "handed_back") for i in ids if i != ids[2]} <= set(outcomes.seen)
    assert {(i, "succeeded") for i in ids} <= set(outcomes.seen)


def test_a_job_reclaimed_while_its_batch_forms_runs_once_at_its_new_attempt(
    db: sa.Engine,
) -> None:
    """A batch member whose lease runs out while the batch still fills (its worker was
    stopped, its connection lost) is claimed again by the fill: the batch runs the new attempt
    alone, never the stale one beside it (model checker seeds 910037, 920006)."""
    (job_id,) = enqueue(db, "slow_fill", [{}])
    worker = Worker(queue, db, concurrency=1, prefetch=0, poll_interval=timedelta(seconds=1))
    with running(worker):
        wait_for(lambda: statuses(db)[job_id] == "running", timeout=20)
        # The leader's lease has run out, as after a stop of its worker longer than the lease.
        with db.begin() as conn:
            conn.execute(
                sa.update(Job)
                .where(Job.id == job_id)
                .values(visible_at=sa.func.now() - timedelta(seconds=1))
            )
        wait_for(lambda: statuses(db)[job_id] == "succeeded", timeout=30)
    # The batch's handler ran the job once, at the attempt the fill's claim started.
    assert runs_of(db) == [(job_id, 2)]
    assert rows_per_job(db) == {job_id: 1}
    assert batch_sizes(db) == {job_id: 1}


def test_a_workers_threads_fill_their_batches_one_claim_at_a_time(
    db: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every thread that takes a job of a batch task leads a batch and fills it; the fill
    claims of one process take turns, so they do not collide at the head of the queue."""
    in_flight = 0
    most = 0
    counting = threading.Lock()
    overlapped = threading.Event()
    real = HeldConnection.rows

    def rows(self: HeldConnection, statement: Any, params: dict[str, Any], **kw: Any) -> Any:
        nonlocal in_flight, most
        if "batch_task" not in params:  # not a fill
            return real(self, statement, params, **kw)
        with counting:
            in_flight += 1
            most = max(most, in_flight)
            if in_flight > 1:
                overlapped.set()
        try:
            overlapped.wait(0.05)  # room for another thread's fill to overlap this one
            return real(self, statement, params, **kw)
        finally:
            with counting:
                in_flight -= 1

    monkeypatch.setattr(HeldConnection, "rows", rows)
    ids = enqueue(db, "per_tenant", [{"tenant": f"t{i % 20}"} for i in range(200)])
    Worker(queue, db, concurrency=8).run(burst=True)
    assert statuses(db) == dict.fromkeys(ids, "succeeded")
    assert rows_per_job(db) == dict.fromkeys(ids, 1)
    assert most == 1


@pytest.mark.slow
def test_sigkill_mid_batch_loses_nothing_and_writes_once(
    tables: sa.Engine, workers: Workers, tmp_path: Path
) -> None:
    db = tables
    hold = tmp_path / "go"
    ids = enqueue(db, "write_rows", [{"hold": str(hold)}] + [{} for _ in range(79)])
    # Two workers from the start (their start-up is most of the test's time): whichever takes
    # the first job forms its batch around it, writes the batch's rows and holds; it is killed.
    procs = [workers.start(concurrency=1), workers.start(concurrency=1)]
    r = batches.runs.c

    def holder() -> int | None:
        with db.connect() as conn:
            return conn.execute(sa.select(r.pid).where(r.job_id == ids[0])).scalar()

    pid = workers.wait(holder, timeout=30)
    (killed,) = [proc for proc in procs if proc.pid == pid]
    workers.signal(killed, signal.SIGKILL)
    workers.wait_exit(killed, timeout=10)
    hold.touch()
    # The other worker takes the killed batch's jobs once their leases (2 s) expire.
    workers.wait(lambda: set(statuses(db).values()) == {"succeeded"}, timeout=60)
    assert rows_per_job(db) == dict.fromkeys(ids, 1)
    with db.connect() as conn:
        again = conn.execute(sa.select(r.job_id).where(r.attempt == 2)).scalars().all()
    assert ids[0] in again


@dataclass
class Point:
    x: int


class Calls(Middleware):
    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def run(self, ctx: Any, payload: Any, proceed: Any) -> Any:
        self.calls.append((type(ctx).__name__, len(payload)))
        return proceed(ctx, payload)


def test_middleware_sees_the_batch_once_and_typed_payloads_are_rebuilt(db: sa.Engine) -> None:
    pytest.importorskip("pydantic")
    calls = Calls()
    typed_queue = JobQueue(default_queue="typed", middleware=[calls])
    seen: list[Any] = []

    @typed_queue.batch_task(max_size=10)
    def points(ctx: BatchContext, jobs: list[BatchJob[Point]]) -> None:
        seen.extend(job.payload for job in jobs)

    with Session(db) as session, session.begin():
        typed_queue.enqueue_many(session, points, [Point(n) for n in range(4)])
    assert drain(typed_queue, db).succeeded == 4
    assert calls.calls == [("BatchContext", 4)]
    assert seen == [Point(n) for n in range(4)]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_batch_report_reaches_every_jobs_row_well_before_the_next_renewal(
    db: sa.Engine, kind: str
) -> None:
    """A batch's report brings its jobs' renewal forward, as a single job's does: with a 30 s
    lease (renewed every 10 s), every row of the batch shows it within a few seconds."""
    progress_queue = JobQueue(default_queue="progress")
    release = threading.Event()
    options: dict[str, Any] = {"max_size": 10, "lease": timedelta(seconds=30)}

    if kind == "sync":

        @progress_queue.batch_task(**options)
        def reports(ctx: BatchContext, jobs: list[BatchJob[dict[str, Any]]]) -> None:
            ctx.report_progress(0.4, "rows read")
            release.wait(30)

    else:

        @progress_queue.batch_task(**options)
        async def reports(ctx: BatchContext, jobs: list[BatchJob[dict[str, Any]]]) -> None:
            ctx.report_progress(0.4, "rows read")
            await asyncio.to_thread(release.wait, 30)

    ids = enqueue(db, "reports", [{} for _ in range(3)], on=progress_queue)
    worker = Worker(progress_queue, db, concurrency=1, prefetch=0)
    j = Job.__table__.c

    def progress() -> dict[int, tuple[Any, Any]]:
        with db.connect() as conn:
            rows = conn.execute(sa.select(j.id, j.progress, j.progress_message))
            return {row.id: (row.progress, row.progress_message) for row in rows}

    try:
        with running(worker):
            wait_for(lambda: set(statuses(db).values()) == {"running"}, timeout=20)
            # The leases' own renewal is 10 s after their claim; the report is written
            # PROGRESS_INTERVAL (2 s) after the last renewal at the latest, and this leaves room
            # for a loaded machine.
            wait_for(lambda: progress() == dict.fromkeys(ids, (0.4, "rows read")), timeout=6)
            release.set()
            wait_for(lambda: set(statuses(db).values()) == {"succeeded"}, timeout=20)
    finally:
        release.set()
