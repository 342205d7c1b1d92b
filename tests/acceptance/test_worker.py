"""The worker in-process: exactly-once under concurrency, fencing, retries, reclaim, schedules."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from sa_jobqueue import Backoff, JobContext, JobQueue, Worker
from sa_jobqueue._backoff import UNKNOWN_TASK_BACKOFF
from sa_jobqueue._sql import claiming, leases, transitions
from sa_jobqueue.models import Job
from sa_jobqueue.worker import _claimer
from sa_jobqueue.worker._heartbeat import Heartbeat
from tests.helpers.jobs import burst, handler, job
from tests.helpers.waiting import running, wait_for

EFFECTS = sa.table("effects", sa.column("job_id", sa.BigInteger), sa.column("note", sa.Text))


TABLES = "CREATE TABLE effects (job_id bigint PRIMARY KEY, note text)"


def effect_ids(engine: sa.Engine) -> list[int]:
    with engine.connect() as conn:
        return list(conn.execute(sa.select(EFFECTS.c.job_id).order_by(EFFECTS.c.job_id)).scalars())


def db_now(engine: sa.Engine) -> Any:
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.now())).scalar_one()


def make_due(engine: sa.Engine, job_id: int) -> None:
    """Move a job's visible_at into the past: a retry's backoff or a lease has run out."""
    with engine.begin() as conn:
        conn.execute(
            sa.update(Job)
            .where(Job.id == job_id)
            .values(visible_at=sa.func.now() - timedelta(seconds=1))
        )


@pytest.mark.parametrize("round_", range(10))
def test_hammer_100_jobs_10_workers_each_runs_once(db: sa.Engine, round_: int) -> None:
    queue = JobQueue()
    runs: Counter[int] = Counter()
    lock = threading.Lock()

    @queue.task
    def work(ctx: JobContext, payload: None) -> None:
        with lock:
            runs[ctx.job_id] += 1
        ctx.session.execute(sa.insert(EFFECTS).values(job_id=ctx.job_id))

    with Session(db) as session, session.begin():
        ids = queue.enqueue_many(session, "work", [None] * 100)
    workers = [Worker(queue, db, concurrency=1, listen=False) for _ in range(10)]
    threads = [threading.Thread(target=w.run, kwargs={"burst": True}) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert runs == Counter(dict.fromkeys(ids, 1))
    assert effect_ids(db) == ids
    with Session(db) as session:
        assert queue.counts(session) == {"default": {"succeeded": 100}}


def test_retries_follow_the_backoff_schedule_then_dead_letter(db: sa.Engine) -> None:
    queue = JobQueue()
    backoff = Backoff(base=timedelta(seconds=10), cap=timedelta(seconds=25), jitter=0)

    @queue.task(max_attempts=4, backoff=backoff)
    def flaky(ctx: JobContext, payload: None) -> None:
        ctx.session.execute(sa.insert(EFFECTS).values(job_id=ctx.job_id))
        raise RuntimeError(f"boom on attempt {ctx.attempt}")

    with Session(db) as session, session.begin():
        job_id = queue.enqueue(session, "flaky")
    # Waits of 10 s, 20 s, then 25 s (the cap), measured by the database clock.
    for attempt, expected in enumerate([10, 20, 25], start=1):
        burst(queue, db)
        row = job(db, job_id)
        assert (row.status, row.attempts) == ("queued", attempt)
        wait = (row.visible_at - db_now(db)).total_seconds()
        assert expected - 2 < wait <= expected
        assert row.last_error["message"] == f"boom on attempt {attempt}"
        make_due(db, job_id)
    burst(queue, db)
    row = job(db, job_id)
    assert (row.status, row.attempts) == ("dead", 4)
    assert row.finished_at is not None
    assert row.last_error["type"] == "builtins.RuntimeError"
    assert "Traceback" in row.last_error["traceback"]
    assert effect_ids(db) == []  # every failed attempt's writes were rolled back


class BrokenBackoff(Backoff):
    """A retry policy whose delay cannot be computed: a bug in settling a failure."""

    def delay(self, attempt: int) -> timedelta:
        raise ZeroDivisionError("the policy itself is broken")


@pytest.mark.parametrize("broken", ["policy", "stored"])
def test_a_failure_whose_retry_delay_cannot_be_computed_is_still_recorded(
    db: sa.Engine, broken: str
) -> None:
    # Settling a failed attempt once raised inside the worker (a backoff that was not a
    # Backoff): the job stayed running until its lease expired and the handler's error was lost.
    queue = JobQueue()
    backoff = BrokenBackoff() if broken == "policy" else Backoff()

    @queue.task(max_attempts=3, backoff=backoff)
    def flaky(ctx: JobContext, payload: None) -> None:
        raise RuntimeError(f"the handler's own error, attempt {ctx.attempt}")

    with Session(db) as session, session.begin():
        job_id = queue.enqueue(session, "flaky")
    if broken == "stored":  # a job's own policy, stored by another version, that cannot be read
        with db.begin() as conn:
            conn.execute(sa.update(Job).where(Job.id == job_id).values(backoff={"base": "soon"}))
    burst(queue, db)
    row = job(db, job_id)
    assert (row.status, row.attempts) == ("queued", 1)
    assert row.last_error["message"] == "the handler's own error, attempt 1"
    assert row.last_error["type"] == "builtins.RuntimeError"
    # The delay fell back to the default policy's: a second or so, not the lease.
    assert timedelta(0) < row.visible_at - db_now(db) <= timedelta(seconds=2)


def test_stale_attempt_cannot_complete_and_its_writes_roll_back(db: sa.Engine) -> None:
    queue = JobQueue()
    started = threading.Event()
    release = threading.Event()
    contexts: list[JobContext] = []

    @queue.task(lease=timedelta(seconds=3))
    def slow(ctx: JobContext, payload: None) -> None:
        contexts.append(ctx)
        started.set()
        assert release.wait(30)
        ctx.session.execute(sa.insert(EFFECTS).values(job_id=ctx.job_id, note="stale"))

    with Session(db) as session, session.begin():
        job_id = queue.enqueue(session, "slow")
    with running(Worker(queue, db, concurrency=1, listen=False)) as worker:
        try:
            assert started.wait(10)
            # The worker froze past its lease; another worker reclaims the job as attempt 2.
            make_due(db, job_id)
            with db.begin() as conn:
                reclaimed = conn.execute(
                    claiming.claim(), {"from_queue": "default", "limit": 10, "worker": "other"}
                ).all()
            assert [(r.id, r.attempts, r.status) for r in reclaimed] == [(job_id, 2, "running")]
            # The first worker's heartbeat finds its lease gone and tells the handler.
            wait_for(lambda: contexts[0].stop_requested, timeout=10)
            release.set()
            wait_for(lambda: not worker._tickets, timeout=10)
        finally:
            release.set()  # let the handler return before the worker is stopped and joined
    row = job(db, job_id)
    assert (row.status, row.attempts, row.worker) == ("running", 2, "other")
    assert effect_ids(db) == []
    # The live attempt completes normally.
    with db.begin() as conn:
        done = conn.execute(transitions.complete(), {"job_id": job_id, "attempt": 2}).rowcount
    assert done == 1
    assert job(db, job_id).status == "succeeded"


@dataclass
class BehindALongJob:
    """Two jobs of one task, for a worker of one thread: a long one, and one that waits in
    the worker's buffer while the long one runs (until ``release`` is set)."""

    queue: JobQueue
    started: threading.Event
    release: threading.Event
    ran: list[tuple[int, int]]  # (job id, attempt) of each handler start
    long_id: int
    buffered: int

    @classmethod
    def enqueue(cls, db: sa.Engine, **task_options: Any) -> BehindALongJob:
        queue = JobQueue()
        started, release = threading.Event(), threading.Event()
        ran: list[tuple[int, int]] = []

        @queue.task(**task_options)
        def work(ctx: JobContext, payload: str) -> None:
            ran.append((ctx.job_id, ctx.attempt))
            if payload == "long":
                started.set()
                assert release.wait(30)

        with Session(db) as session, session.begin():
            long_id = queue.enqueue(session, "work", "long")
            buffered = queue.enqueue(session, "work", "short")
        return cls(queue, started, release, ran, long_id, buffered)

    def waiting(self, db: sa.Engine) -> None:
        """Once the long job runs and the other is claimed into the buffer."""
        assert self.started.wait(10)
        wait_for(lambda: job(db, self.buffered).status == "running")


def test_a_buffered_job_another_worker_took_over_is_not_started_here(db: sa.Engine) -> None:
    """The job waited in the worker's buffer behind a long one while its lease was taken over
    (the worker had frozen past it): the heartbeat finds it lost, and no thread starts it."""
    jobs = BehindALongJob.enqueue(db, lease=timedelta(seconds=3))
    worker = Worker(jobs.queue, db, concurrency=1, listen=False, prefetch=2)
    with running(worker):
        try:
            jobs.waiting(db)
            make_due(db, jobs.buffered)
            with db.begin() as conn:
                params = {"from_queue": "default", "limit": 10, "worker": "other"}
                taken = [(r.id, r.attempts) for r in conn.execute(claiming.claim(), params)]
            assert taken == [(jobs.buffered, 2)]
            leases_ = worker._leases
            wait_for(lambda: leases_.snapshot()[jobs.buffered].lost, timeout=10)  # its renewal
            jobs.release.set()
            wait_for(lambda: not worker._tickets, timeout=10)
        finally:
            jobs.release.set()
    assert jobs.ran == [(jobs.long_id, 1)]  # attempt 1 of the buffered job never started here
    row = job(db, jobs.buffered)
    assert (row.status, row.attempts, row.worker) == ("running", 2, "other")


def test_a_buffered_job_whose_lease_ran_out_is_handed_back_uncounted_then_runs(
    db: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By the worker's count the job's lease ran out while it waited behind a long one (no
    renewal went out), and nobody took it over: it goes back to the queue as if never
    claimed, and runs, its only attempt not spent."""
    monkeypatch.setattr(Heartbeat, "turn", lambda self, now: None)  # renews nothing
    jobs = BehindALongJob.enqueue(db, max_attempts=1)
    worker = Worker(jobs.queue, db, concurrency=1, listen=False, prefetch=1)
    with running(worker):
        try:
            jobs.waiting(db)
            # The worker's count runs out (its clock jumped as after a freeze); the database
            # still holds the 30 s lease, so no claim takes the job meanwhile.
            worker._leases.snapshot()[jobs.buffered].expires = 0.0
            jobs.release.set()
            wait_for(lambda: job(db, jobs.buffered).status == "succeeded", timeout=20)
        finally:
            jobs.release.set()
    assert jobs.ran == [(jobs.long_id, 1), (jobs.buffered, 1)]
    row = job(db, jobs.buffered)
    assert (row.attempts, row.attempt_history) == (1, None)  # no attempt ended before


def test_stale_attempt_cannot_record_a_failure(db: sa.Engine) -> None:
    queue = JobQueue()
    started = threading.Event()
    release = threading.Event()

    @queue.task
    def doomed(ctx: JobContext, payload: None) -> None:
        started.set()
        assert release.wait(30)
        raise ValueError("late failure")

    with Session(db) as session, session.begin():
        job_id = queue.enqueue(session, "doomed")
    with running(Worker(queue, db, concurrency=1, listen=False)) as worker:
        try:
            assert started.wait(10)
            make_due(db, job_id)
            with db.begin() as conn:
                conn.execute(
                    claiming.claim(), {"from_queue": "default", "limit": 1, "worker": "other"}
                )
            release.set()
            wait_for(lambda: not worker._tickets, timeout=10)
        finally:
            release.set()  # let the handler return before the worker is stopped and joined
    row = job(db, job_id)
    assert (row.status, row.attempts) == ("running", 2)
    assert (
        row.last_error["message"] == claiming.LEASE_EXPIRED
    )  # not overwritten by the stale attempt


def test_expired_lease_is_reclaimed_by_the_claim_and_counts_an_attempt(db: sa.Engine) -> None:
    queue = JobQueue()
    seen: list[int] = []

    @queue.task
    def once(ctx: JobContext, payload: None) -> None:
        seen.append(ctx.attempt)

    with Session(db) as session, session.begin():
        job_id = queue.enqueue(session, "once")
    with db.begin() as conn:  # a worker claims it, then dies without a trace
        conn.execute(claiming.claim(), {"from_queue": "default", "limit": 1, "worker": "lost"})
    burst(queue, db)
    assert seen == []  # the lease has not expired yet
    make_due(db, job_id)
    burst(queue, db)
    assert seen == [2]
    row = job(db, job_id)
    assert (row.status, row.attempts) == ("succeeded", 2)


def test_reclaimed_job_with_no_attempts_left_goes_dead_without_running(db: sa.Engine) -> None:
    queue = JobQueue()
    seen: list[int] = []

    @queue.task(max_attempts=1)
    def fragile(ctx: JobContext, payload: None) -> None:
        seen.append(ctx.job_id)

    with Session(db) as session, session.begin():
        job_id = queue.enqueue(session, "fragile")
        other = queue.enqueue(session, "fragile")
    with db.begin() as conn:
        conn.execute(claiming.claim(), {"from_queue": "default", "limit": 1, "worker": "lost"})
    make_due(db, job_id)
    burst(queue, db)
    row = job(db, job_id)
    assert (row.status, row.attempts) == ("dead", 1)
    assert row.last_error == {"type": "LeaseExpired", "message": claiming.LEASE_EXPIRED}
    assert row.finished_at is not None
    assert seen == [other]


def test_an_unknown_task_is_retried_with_backoff_until_a_worker_that_knows_it_runs_it(
    db: sa.Engine,
) -> None:
    # A rolling deploy: new code enqueues a task the old workers do not have yet.
    old, new = JobQueue(), JobQueue()
    ran: list[int] = []

    @new.task(max_attempts=3)
    def added(ctx: JobContext, payload: None) -> None:
        ran.append(ctx.job_id)

    @new.task(name="current")
    @old.task(name="current")
    def current(ctx: JobContext, payload: None) -> None:
        ran.append(ctx.job_id)

    with Session(db) as session, session.begin():
        ghost = new.enqueue(session, "added")
        live = new.enqueue(session, "current")
    expected = [UNKNOWN_TASK_BACKOFF.delay(1), UNKNOWN_TASK_BACKOFF.delay(2)]
    for attempt, delay in enumerate(expected, start=1):
        burst(old, db)
        row = job(db, ghost)
        assert (row.status, row.attempts) == ("queued", attempt)
        assert row.last_error["type"] == "sa_jobqueue.errors.UnknownTaskError"
        assert "'added'" in row.last_error["message"]
        wait = (row.visible_at - db_now(db)).total_seconds()
        assert delay.total_seconds() * 0.8 - 2 < wait <= delay.total_seconds() * 1.2
        make_due(db, ghost)
    assert ran == [live]  # the old worker carried on with what it knows
    burst(new, db)
    row = job(db, ghost)
    assert (row.status, row.attempts) == ("succeeded", 3)
    assert ran == [live, ghost]


def test_an_unknown_task_out_of_attempts_goes_dead_with_its_error(db: sa.Engine) -> None:
    producer, consumer = JobQueue(), JobQueue()
    producer.task(name="retired", max_attempts=2)(handler)
    with Session(db) as session, session.begin():
        ghost = producer.enqueue(session, "retired")
    burst(consumer, db)
    make_due(db, ghost)
    burst(consumer, db)
    row = job(db, ghost)
    assert (row.status, row.attempts) == ("dead", 2)
    assert row.last_error["type"] == "sa_jobqueue.errors.UnknownTaskError"


def test_a_future_run_at_is_not_run_early(db: sa.Engine) -> None:
    queue = JobQueue()
    ran: list[int] = []

    @queue.task
    def later(ctx: JobContext, payload: None) -> None:
        ran.append(ctx.job_id)

    now = db_now(db)
    with Session(db) as session, session.begin():
        soon = queue.enqueue(session, "later", run_at=timedelta(seconds=1))
        far = queue.enqueue(session, "later", run_at=now + timedelta(hours=1))
        due = queue.enqueue(session, "later")
    burst(queue, db)
    assert ran == [due]
    wait_for(lambda: db_now(db) >= job(db, soon).visible_at, timeout=10)
    burst(queue, db)
    assert ran == [due, soon]
    assert job(db, far).status == "queued"


def test_lower_priority_number_runs_first(db: sa.Engine) -> None:
    queue = JobQueue()
    order: list[int] = []

    @queue.task
    def ranked(ctx: JobContext, payload: int) -> None:
        order.append(payload)

    with Session(db) as session, session.begin():
        for priority in (5, 0, 3, -2):
            queue.enqueue(session, "ranked", priority, priority=priority)
    burst(queue, db, concurrency=1)
    assert order == [-2, 0, 3, 5]


def test_a_higher_priority_job_waits_about_a_second_at_most_behind_a_saturated_backlog(
    db: sa.Engine,
) -> None:
    """A saturated worker claims past the last row it took (not over the entries claimed jobs
    left at the head): a job due before that position is found by the next claim from the
    head, which comes at least every HEAD_EVERY seconds, not when the backlog runs out."""
    queue = JobQueue()

    @queue.task
    def backlog(ctx: JobContext, payload: None) -> None:
        time.sleep(0.001)  # a job's work: it keeps the worker saturated for seconds

    @queue.task
    def urgent(ctx: JobContext, payload: None) -> None:
        pass

    with Session(db) as session, session.begin():
        queue.enqueue_many(session, "backlog", [None] * 20_000, priority=5)

    def succeeded() -> int:
        with Session(db) as session:
            return queue.counts(session)["default"].get("succeeded", 0)

    with running(Worker(queue, db, concurrency=2, listen=False)):
        wait_for(lambda: succeeded() >= 200, timeout=30)  # saturated, claiming past a position
        with Session(db) as session, session.begin():
            urgent_id = queue.enqueue(session, "urgent", priority=0)
        wait_for(lambda: job(db, urgent_id).status == "succeeded", timeout=30)
    row = job(db, urgent_id)
    assert row.started_at is not None
    waited = row.started_at - row.created_at  # both the database's clock
    # HEAD_EVERY (1 s), and a claim round and the buffer ahead of it to spare.
    assert _claimer.HEAD_EVERY == 1.0
    assert waited <= timedelta(seconds=1.75), waited
    with db.connect() as conn:  # most of the backlog was still waiting when it started
        after = conn.execute(
            sa.select(sa.func.count()).where(
                Job.priority == 5,
                sa.or_(Job.started_at.is_(None), Job.started_at > row.started_at),
            )
        ).scalar_one()
    assert after >= 5_000, after


def test_handler_commit_does_not_commit_early(db: sa.Engine) -> None:
    queue = JobQueue()

    @queue.task(max_attempts=1)
    def sneaky(ctx: JobContext, payload: None) -> None:
        ctx.session.execute(sa.insert(EFFECTS).values(job_id=ctx.job_id))
        ctx.session.commit()  # only the worker's fenced completion may commit
        raise RuntimeError("after commit")

    with Session(db) as session, session.begin():
        job_id = queue.enqueue(session, "sneaky")
    burst(queue, db)
    assert job(db, job_id).status == "dead"
    assert effect_ids(db) == []


def test_orm_writes_in_the_handler_session_commit_with_the_completion(db: sa.Engine) -> None:
    queue = JobQueue()

    class Base(sa.orm.DeclarativeBase):
        pass

    class Effect(Base):
        __tablename__ = "effects"
        job_id: sa.orm.Mapped[int] = sa.orm.mapped_column(sa.BigInteger, primary_key=True)
        note: sa.orm.Mapped[str | None]

    @queue.task
    def orm_write(ctx: JobContext, payload: str) -> None:
        ctx.session.add(Effect(job_id=ctx.job_id, note=payload))  # flushed by the worker

    with Session(db) as session, session.begin():
        job_id = queue.enqueue(session, "orm_write", "hello")
    burst(queue, db)
    assert job(db, job_id).status == "succeeded"
    assert effect_ids(db) == [job_id]


def test_nul_and_huge_error_messages_are_recorded_cleaned_and_truncated(db: sa.Engine) -> None:
    queue = JobQueue()

    @queue.task(max_attempts=2)
    def noisy(ctx: JobContext, payload: None) -> None:
        raise ValueError("bad\x00byte " + "x" * 3_000_000 + "\udcff")

    with Session(db) as session, session.begin():
        job_id = queue.enqueue(session, "noisy")
    burst(queue, db)
    row = job(db, job_id)
    assert (row.status, row.attempts) == ("queued", 1)  # recorded and rescheduled, not stuck
    message = row.last_error["message"]
    assert message.startswith("bad\N{REPLACEMENT CHARACTER}byte xxx")
    assert len(message) < 2_100
    assert len(row.last_error["traceback"]) < 21_000


def test_notify_wakes_an_idle_worker_long_before_the_poll(db: sa.Engine) -> None:
    queue = JobQueue()
    done = threading.Event()

    @queue.task
    def ping(ctx: JobContext, payload: None) -> None:
        done.set()

    with running(Worker(queue, db, poll_interval=timedelta(seconds=60))):
        # The listener is up once the worker's LISTEN backend shows in pg_stat_activity.
        wait_for(lambda: _listening(db), timeout=10)
        with Session(db) as session, session.begin():
            queue.enqueue(session, "ping")
        assert done.wait(10), "the job was not picked up by NOTIFY"


def _listening(engine: sa.Engine) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND query LIKE 'LISTEN%'"
                )
            ).scalar()
        )


def test_stop_lets_the_running_job_finish(db: sa.Engine) -> None:
    queue = JobQueue()
    started = threading.Event()
    release = threading.Event()

    @queue.task
    def steady(ctx: JobContext, payload: None) -> None:
        started.set()
        assert release.wait(30)
        ctx.session.execute(sa.insert(EFFECTS).values(job_id=ctx.job_id))

    with Session(db) as session, session.begin():
        job_id = queue.enqueue(session, "steady")
    worker = Worker(queue, db, listen=False)
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(worker.run()))
    thread.start()
    assert started.wait(10)
    worker.stop()
    with Session(db) as session, session.begin():
        later = queue.enqueue(session, "steady")
    release.set()
    thread.join(30)
    assert result == [True]
    assert job(db, job_id).status == "succeeded"
    assert job(db, later).status == "queued"  # nothing was claimed after stop()


def test_finished_at_is_when_the_job_completed_not_when_its_transaction_began(
    db: sa.Engine,
) -> None:
    queue = JobQueue()

    @queue.task
    def early_writer(ctx: JobContext, payload: None) -> None:
        ctx.session.execute(sa.insert(EFFECTS).values(job_id=ctx.job_id))  # begins the txn
        time.sleep(0.3)  # simulated work after the first write

    with Session(db) as session, session.begin():
        job_id = queue.enqueue(session, "early_writer")
    burst(queue, db)
    row = job(db, job_id)
    assert row.started_at is not None
    assert row.finished_at is not None
    assert row.finished_at - row.started_at >= timedelta(seconds=0.3)


def test_the_claim_buffer_grows_for_short_jobs_and_a_fixed_prefetch_stays(
    db: sa.Engine,
) -> None:
    queue = JobQueue()

    @queue.task
    def instant(ctx: JobContext, payload: None) -> None:
        pass

    with Session(db) as session, session.begin():
        queue.enqueue_many(session, "instant", [None] * 2_000)
    adaptive = Worker(queue, db, concurrency=2, listen=False)
    adaptive.run(burst=True)
    assert adaptive.prefetch > 2  # grew from its start at the concurrency
    assert adaptive.prefetch <= 16  # PREFETCH_MAX_FACTOR * concurrency

    with Session(db) as session, session.begin():
        queue.enqueue_many(session, "instant", [None] * 500)
    fixed = Worker(queue, db, concurrency=2, listen=False, prefetch=3)
    fixed.run(burst=True)
    assert fixed.prefetch == 3
    with Session(db) as session:
        assert queue.counts(session) == {"default": {"succeeded": 2_500}}


@pytest.mark.parametrize("statement", ["complete_many", "extend_leases", "release"])
def test_batched_transitions_find_their_rows_by_primary_key(db: sa.Engine, statement: str) -> None:
    """Statistics taken while a backlog is all queued must not turn them into backlog scans."""
    queue = JobQueue()

    @queue.task
    def idle(ctx: JobContext, payload: None) -> None:  # pragma: no cover - never runs
        pass

    with Session(db) as session, session.begin():
        ids = queue.enqueue_many(session, "idle", [None] * 5_000)
    with db.begin() as conn:
        conn.exec_driver_sql("ANALYZE sa_jobqueue_jobs")
        builder = getattr(leases if statement == "extend_leases" else transitions, statement)
        compiled = builder().compile(
            dialect=conn.dialect, compile_kwargs={"render_postcompile": True}
        )
        params = {**compiled.params, "job_ids": ids[:50], "attempt_list": [1] * 50}
        params["progress"] = "{}"  # for extend_leases: no report to write
        plan = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + str(compiled), params).scalar()
        conn.rollback()
    text = str(plan)
    assert "sa_jobqueue_jobs_pkey" in text
    assert "sa_jobqueue_jobs_claim_idx" not in text
