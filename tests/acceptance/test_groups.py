"""Fast writing jobs share a transaction, a savepoint each: fewer commits, same guarantees."""

from __future__ import annotations

import functools
import threading
from collections import Counter
from datetime import timedelta

import pytest
import sqlalchemy as sa

from sa_jobqueue import Backoff, JobContext, JobQueue, Worker
from sa_jobqueue.models import Job
from sa_jobqueue.worker import _runner
from tests.helpers.jobs import burst, enqueue_many, statuses
from tests.helpers.waiting import running, wait_for

EFFECTS = sa.table(
    "effects",
    sa.column("n", sa.Integer),
    sa.column("note", sa.Text),
    sa.column("tx", sa.BigInteger),
)


# tx: the writing (top-level) transaction; a row's xmin would name its savepoint's.
TABLES = "CREATE TABLE effects (n int, note text, tx bigint DEFAULT txid_current())"
drain = functools.partial(burst, retention=None)


def effect_counts(engine: sa.Engine) -> Counter[int]:
    with engine.connect() as conn:
        return Counter(conn.execute(sa.select(EFFECTS.c.n)).scalars())


def transactions(engine: sa.Engine) -> int:
    """How many transactions wrote the effects."""
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count(EFFECTS.c.tx.distinct()))).scalar_one()


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every handler counts as fast enough to group: on a loaded machine a run (its first
    session and statements above all) can take longer than GROUP_FAST's 20 ms, and then
    nothing is grouped. What these tests count is what groups do."""
    monkeypatch.setattr(_runner, "GROUP_FAST", 1.0)


def test_fast_writing_jobs_share_commits_and_write_once(db: sa.Engine, fast: None) -> None:
    queue = JobQueue()

    @queue.task
    def write(ctx: JobContext, n: int) -> None:
        ctx.session.execute(sa.insert(EFFECTS).values(n=n))

    enqueue_many(db, "write", list(range(600)), queue=queue)
    drain(queue, db, concurrency=2, prefetch=100)

    assert effect_counts(db) == Counter(range(600))
    assert statuses(db) == {"succeeded": 600}
    # One commit per job would be 600 transactions; shared ones are far fewer.
    assert transactions(db) < 300


def test_a_failing_job_rolls_back_only_its_own_writes(db: sa.Engine, fast: None) -> None:
    queue = JobQueue()

    @queue.task(max_attempts=2, backoff=Backoff(base=timedelta(milliseconds=10), jitter=0))
    def flaky(ctx: JobContext, n: int) -> None:
        ctx.session.execute(sa.insert(EFFECTS).values(n=n, note=f"attempt {ctx.attempt}"))
        if n % 7 == 3 and ctx.attempt == 1:
            raise RuntimeError("first attempts of these fail after writing")

    enqueue_many(db, "flaky", list(range(300)), queue=queue)
    drain(queue, db, concurrency=2, prefetch=100)

    assert effect_counts(db) == Counter(range(300))  # the failed attempts' rows are gone
    with db.connect() as conn:
        notes = dict(conn.execute(sa.select(EFFECTS.c.n, EFFECTS.c.note)).all())
        attempts = Counter(conn.execute(sa.select(Job.attempts)).scalars())
    assert all(notes[n] == "attempt 2" for n in range(300) if n % 7 == 3)
    assert attempts == {1: 300 - 43, 2: 43}
    assert transactions(db) < 200


def test_rollback_in_a_handler_discards_only_that_jobs_writes(db: sa.Engine, fast: None) -> None:
    queue = JobQueue()

    @queue.task
    def second_thoughts(ctx: JobContext, n: int) -> None:
        ctx.session.execute(sa.insert(EFFECTS).values(n=n, note="discarded"))
        ctx.session.rollback()
        ctx.session.execute(sa.insert(EFFECTS).values(n=n, note="kept"))

    enqueue_many(db, "second_thoughts", list(range(200)), queue=queue)
    drain(queue, db, concurrency=2, prefetch=100)

    with db.connect() as conn:
        rows = conn.execute(sa.select(EFFECTS.c.n, EFFECTS.c.note)).all()
    assert sorted(rows) == [(n, "kept") for n in range(200)]
    assert transactions(db) < 100


def test_a_member_that_cannot_complete_rolls_the_group_back_and_nothing_is_lost(
    db: sa.Engine,
) -> None:
    """A job of the group loses its lease while it runs (here: another worker "reclaims" it).

    Its completion fails at the group's commit, so the whole group rolls back; the other
    members are handed back and run again. Every job's row is written exactly once.
    """
    queue = JobQueue()
    runs: Counter[int] = Counter()
    lock = threading.Lock()
    victim = 150

    @queue.task
    def write(ctx: JobContext, n: int) -> None:
        with lock:
            runs[n] += 1
            first = runs[n] == 1
        if n == victim and first:
            # As if its lease had run out and another worker had taken the job over.
            with db.begin() as other:
                other.execute(
                    sa.update(Job)
                    .where(Job.id == ctx.job_id)
                    .values(attempts=Job.attempts + 1, visible_at=sa.func.now())
                )
        ctx.session.execute(sa.insert(EFFECTS).values(n=n))

    enqueue_many(db, "write", list(range(300)), queue=queue)
    drain(queue, db, concurrency=1, prefetch=300)

    assert effect_counts(db) == Counter(range(300))
    assert statuses(db) == {"succeeded": 300}
    assert runs[victim] == 2
    # Its group's other members ran twice too: their first writes were rolled back.
    assert sum(runs.values()) > 302


def test_a_row_locked_elsewhere_does_not_stall_the_heartbeat(db: sa.Engine) -> None:
    """An application transaction holds a running job's row (say, a cancel not yet committed).

    The heartbeat skips the locked row instead of waiting for it: it goes on enforcing the
    other jobs' timeouts, and does not take the locked job for lost while its lease lasts (a
    lease that expires under the lock is lost: test_liveness covers that).
    """
    queue = JobQueue()
    started: dict[str, threading.Event] = {"hold": threading.Event(), "slow": threading.Event()}
    release = threading.Event()
    told_to_stop: dict[str, bool] = {}

    def body(ctx: JobContext, payload: None) -> None:
        started[ctx.task].set()
        release.wait(20)
        told_to_stop[ctx.task] = ctx.stop_requested

    # Renewed every 1.5 s, so renewals meet the lock, which lasts about as long as the slow
    # job's timeout (1.5 s) and ends well before this lease would run out.
    queue.task(name="hold", lease=timedelta(seconds=4.5))(body)
    queue.task(name="slow", timeout=timedelta(seconds=1.5))(body)
    (held_id,) = enqueue_many(db, "hold", [None], queue=queue)
    (slow_id,) = enqueue_many(db, "slow", [None], queue=queue)
    with running(Worker(queue, db, concurrency=2, listen=False, retention=None)):
        assert started["hold"].wait(10)
        assert started["slow"].wait(10)
        with db.begin() as app:
            app.execute(sa.select(Job.id).where(Job.id == held_id).with_for_update())
            # A heartbeat waiting for this lock would never record the other job's timeout.
            wait_for(lambda: statuses(db)["running"] == 1, timeout=5)
        release.set()
        wait_for(lambda: statuses(db)["succeeded"] == 1, timeout=10)

    assert told_to_stop == {"hold": False, "slow": True}
    with db.connect() as conn:
        slow = conn.execute(sa.select(Job.status, Job.last_error).where(Job.id == slow_id)).one()
    assert slow.status == "queued"
    assert slow.last_error["type"] == "builtins.TimeoutError"


def test_a_burst_runs_the_jobs_that_grouped_jobs_enqueue(db: sa.Engine) -> None:
    """A group commits before its jobs count as finished, so a burst sees what they enqueued."""
    queue = JobQueue()

    @queue.task
    def chain(ctx: JobContext, n: int) -> None:
        ctx.session.execute(sa.insert(EFFECTS).values(n=n))
        if n < 30:
            queue.enqueue(ctx.session, chain, n + 1)

    enqueue_many(db, "chain", [1], queue=queue)
    drain(queue, db, concurrency=1)

    assert effect_counts(db) == Counter(range(1, 31))
    assert statuses(db) == {"succeeded": 30}


@pytest.mark.parametrize("swallow", [False, True], ids=["raises", "swallows"])
def test_a_failed_statement_in_a_group_costs_only_its_own_job(
    db: sa.Engine, swallow: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job whose insert fails (a duplicate key) amid a group of jobs that succeed.

    Whether the handler lets the error out or swallows it, only that job fails: the other
    jobs' writes and completions commit together, and nothing completes without its write.
    """
    # One warm-up run makes the task known to be fast; on a loaded machine that first run
    # (its session and statements made for the first time) can take longer than GROUP_FAST's
    # 20 ms, and then nothing is grouped. What is tested here is a failure inside a group.
    monkeypatch.setattr(_runner, "GROUP_FAST", 1.0)
    queue = JobQueue()
    with db.begin() as conn:
        conn.exec_driver_sql("CREATE UNIQUE INDEX ON effects (n)")
        conn.execute(sa.insert(EFFECTS).values(n=-1))

    @queue.task(max_attempts=1)
    def write(ctx: JobContext, n: int) -> None:
        try:
            ctx.session.execute(sa.insert(EFFECTS).values(n=n))
        except sa.exc.IntegrityError:
            if not swallow:
                raise

    enqueue_many(
        db, "write", [0], queue=queue
    )  # a first run, alone, makes the task known to be fast
    drain(queue, db, concurrency=1)
    enqueue_many(db, "write", [1, 2, 3, -1, 4, 5, 6, 7], queue=queue)
    drain(queue, db, concurrency=1, prefetch=100)

    assert effect_counts(db) == Counter([-1, 0, 1, 2, 3, 4, 5, 6, 7])
    assert statuses(db) == {"succeeded": 8, "dead": 1}
    assert transactions(db) < 8  # the others did share transactions
