"""Enqueues with ``depends_on`` that share dependencies, from many threads at once, never
deadlock: each locks the jobs it depends on in one global order (ids ascending), at the
enqueue and again at its commit, and the commit's look takes a lock that another enqueue's
does not wait for."""

from __future__ import annotations

import random
import threading
from collections import Counter
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from sa_jobqueue import JobContext, JobQueue
from sa_jobqueue._sql import claiming, transitions
from sa_jobqueue.models import jobs_table
from sa_jobqueue.workflows import Call

j = jobs_table.c
THREADS = 8
ROUNDS = 100


def make_queue() -> JobQueue:
    queue = JobQueue(default_queue="locks")

    @queue.task
    def step(ctx: JobContext, payload: Any) -> None:
        pass

    return queue


def hammer(engine: sa.Engine, enqueue: Any, rounds: int = ROUNDS) -> Counter[str]:
    """Run ``enqueue(session, rng)`` in ``rounds`` transactions on each of THREADS threads; the
    outcomes by name ("ok", or the database error's class)."""
    outcomes: Counter[str] = Counter()
    lock = threading.Lock()
    start = threading.Barrier(THREADS)

    def run(seed: int) -> None:
        rng = random.Random(seed)
        start.wait()
        for _ in range(rounds):
            try:
                with Session(engine) as session, session.begin():
                    enqueue(session, rng)
                outcome = "ok"
            except sa.exc.DBAPIError as exc:
                outcome = type(exc.orig).__name__
            with lock:
                outcomes[outcome] += 1

    threads = [threading.Thread(target=run, args=(seed,)) for seed in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    return outcomes


def pending(engine: sa.Engine, queue: JobQueue, n: int) -> list[int]:
    with Session(engine) as session, session.begin():
        return [int(i) for i in queue.enqueue_many(session, "step", [{}] * n)]


def test_enqueues_naming_the_same_dependencies_in_any_order_never_deadlock(
    engine: sa.Engine,
) -> None:
    queue = make_queue()
    deps = pending(engine, queue, 4)

    def enqueue(session: Session, rng: random.Random) -> None:
        queue.enqueue(session, "step", {}, depends_on=rng.sample(deps, len(deps)))

    outcomes = hammer(engine, enqueue)
    assert outcomes == Counter(ok=THREADS * ROUNDS)
    assert psycopg.errors.DeadlockDetected.__name__ not in outcomes
    with engine.connect() as conn:
        waiting = conn.execute(sa.select(sa.func.count()).where(j.status == "waiting"))
        assert waiting.scalar_one() == THREADS * ROUNDS


@pytest.mark.parametrize("shape", ["calls", "many", "chain"])
def test_transactions_of_several_enqueues_never_deadlock(engine: sa.Engine, shape: str) -> None:
    """Several enqueues in one transaction, each naming some of the same dependencies: the
    look at commit takes them in whatever order the calls came, and still nothing waits in a
    cycle."""
    queue = make_queue()
    deps = pending(engine, queue, 4)

    def enqueue(session: Session, rng: random.Random) -> None:
        order = rng.sample(deps, len(deps))
        if shape == "calls":
            for dep in order:
                queue.enqueue(session, "step", {}, depends_on=[dep])
        elif shape == "many":
            queue.enqueue_many(session, "step", [{}, {}], depends_on=order[:3])
            queue.enqueue_many(session, "step", [{}], depends_on=order[1:])
        else:
            queue.chain(session, [Call("step", {}), Call("step", {})], depends_on=order[:2])
            queue.chain(session, [Call("step", {})], depends_on=order[2:])

    outcomes = hammer(engine, enqueue, rounds=25)
    assert outcomes == Counter(ok=THREADS * 25)


def claim(engine: sa.Engine, job_id: int) -> int:
    with engine.begin() as conn:
        params = {"from_queue": "locks", "limit": 1, "worker": "w"}
        (row,) = conn.execute(claiming.claim(), params).all()
    assert row.id == job_id
    return int(row.attempts)


def serialization_failure(exc: BaseException) -> bool:
    orig = getattr(exc, "orig", None)
    return isinstance(orig, psycopg.errors.SerializationFailure)


@pytest.mark.parametrize("when", ["at the enqueue", "at commit"])
def test_under_repeatable_read_a_dependency_changed_meanwhile_fails_the_transaction(
    engine: sa.Engine, when: str
) -> None:
    """As any write conflict at that level: a serialization failure, the transaction rolled
    back, and the retry (a new snapshot) succeeds."""
    queue = make_queue()
    (dep,) = pending(engine, queue, 1)
    repeatable = engine.execution_options(isolation_level="REPEATABLE READ")
    attempt = claim(engine, dep) if when == "at commit" else 0
    session = Session(repeatable)
    session.begin()
    session.execute(sa.select(1))  # the snapshot is taken
    if when == "at the enqueue":
        claim(engine, dep)  # committed after the snapshot
        with pytest.raises(sa.exc.OperationalError) as raised:
            queue.enqueue(session, "step", {}, depends_on=[dep])
    else:
        queue.enqueue(session, "step", {}, depends_on=[dep])  # running: it waits
        # Its completion commits after the snapshot, before the enqueue commits.
        with engine.begin() as conn:
            params = {"job_ids": [dep], "attempt_list": [attempt]}
            assert len(conn.execute(transitions.complete_many(), params).all()) == 1
        with pytest.raises(sa.exc.OperationalError) as raised:
            session.commit()
    assert serialization_failure(raised.value)
    session.close()
    with Session(repeatable) as session, session.begin():  # the retry
        again = queue.enqueue(session, "step", {}, depends_on=[dep])
    with engine.connect() as conn:
        status = conn.execute(sa.select(j.status).where(j.id == again)).scalar_one()
    assert status == ("waiting" if when == "at the enqueue" else "queued")
