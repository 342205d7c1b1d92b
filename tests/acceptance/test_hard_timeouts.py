"""Hard time limits: attempts run in child processes of real ``sa-jobqueue worker``s, killed
at their task's ``hard_timeout`` with their writes rolled back, and never outliving it, even
while their worker is stopped."""

from __future__ import annotations

import functools
import json
import signal

import sqlalchemy as sa
from sqlalchemy.orm import Session

from sa_jobqueue.models import jobs_table
from tests.apps import hard_limits
from tests.helpers import jobs
from tests.helpers.jobs import statuses
from tests.helpers.processes import WorkerApp, Workers, committed_effects

WORKER_APP = WorkerApp("tests.apps.hard_limits:queue", log_level="INFO")
TABLES = hard_limits.metadata
j = jobs_table.c
enqueue = functools.partial(jobs.enqueue, queue=hard_limits.queue)
effects = functools.partial(committed_effects, hard_limits.effects)


def job(engine: sa.Engine, job_id: int) -> sa.Row[tuple[object, ...]]:
    with engine.connect() as conn:
        return conn.execute(
            sa.select(j.status, j.attempts, j.last_error, j.attempt_history, j.result).where(
                j.id == job_id
            )
        ).one()


def attempt_backends(engine: sa.Engine, job_id: int | None = None) -> int:
    """Server sessions of attempts' child processes on this database (of one job's)."""
    name = "sa-jobqueue attempt " + ("%" if job_id is None else str(job_id))
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND application_name LIKE :name"
                ),
                {"name": name},
            ).scalar_one()
        )


def test_an_attempt_killed_at_its_limit_or_cancelled_writes_nothing(
    tables: sa.Engine, workers: Workers
) -> None:
    killed = enqueue(tables, "stall_first")
    done = enqueue(tables, "report_pid")
    failed = enqueue(tables, "fail")
    hanging = enqueue(tables, "hang")
    worker = workers.start(concurrency=4)
    # A cancellation kills an attempt well inside its limit (60 s): as soon as the worker
    # learns of it, at the lease's next renewal (a third of the 30 s lease after the claim).
    workers.wait(lambda: attempt_backends(tables, hanging) == 1, 30)
    with Session(tables) as session, session.begin():
        assert hard_limits.queue.cancel(session, hanging)
    workers.wait(lambda: job(tables, hanging).status == "cancelled", 25)
    workers.wait(lambda: attempt_backends(tables, hanging) == 0, 5)
    assert effects(tables, hanging) == []
    workers.wait(
        lambda: statuses(tables, [killed, done, failed]) == {"succeeded": 2, "dead": 1}, 30
    )
    # The first attempt wrote its row, then was killed at 1 s: its row was rolled back, and
    # the failure recorded; the second attempt's row is the one that committed.
    assert [attempt for attempt, _ in effects(tables, killed)] == [2]
    history = job(tables, killed).attempt_history
    assert history[0]["attempt"] == 1
    assert history[0]["error"]["type"] == "sa_jobqueue.errors.HardTimeoutError"
    # The attempt ran in a process of its own, and its result was kept.
    ((_, pid),) = effects(tables, done)
    assert pid != worker.pid
    assert job(tables, done).result == {"pid": pid}
    # A handler's exception is kept as raised in the child; its write rolled back.
    error = job(tables, failed).last_error
    assert (error["type"], error["message"]) == ("builtins.LookupError", "no such thing")
    assert "in fail" in error["traceback"]
    assert effects(tables, failed) == []


def test_an_attempt_dies_at_its_limit_while_its_worker_is_stopped(
    tables: sa.Engine, workers: Workers
) -> None:
    stalled = enqueue(tables, "stall")
    worker = workers.start(concurrency=1)
    workers.wait(lambda: attempt_backends(tables) == 1, 30)
    workers.signal(worker, signal.SIGSTOP)
    try:
        # Its worker cannot kill it: the attempt kills itself at its limit (5 s, plus a
        # margin), and its server session goes with it.
        workers.wait(lambda: attempt_backends(tables) == 0, 10)
        assert job(tables, stalled).status == "running"
    finally:
        worker.send_signal(signal.SIGCONT)
    workers.wait(lambda: job(tables, stalled).status == "dead", 10)
    assert effects(tables, stalled) == []
    error = job(tables, stalled).last_error
    assert error["type"] == "sa_jobqueue.errors.HardTimeoutError", json.dumps(error)


def test_an_attempt_killed_at_its_limit_while_its_worker_stops_is_a_failure(
    tables: sa.Engine, workers: Workers
) -> None:
    stalled = enqueue(tables, "stall_first")
    worker = workers.start(concurrency=1)
    workers.wait(lambda: attempt_backends(tables) == 1, 30)
    workers.signal(worker, signal.SIGTERM)
    # The shutdown waits for the attempt (its grace is 30 s), which is killed at its limit of
    # 1 s: the kill is the attempt's failure, as without a shutdown, not a hand-back of a job
    # the shutdown stopped part-way (that would give it one more attempt and no error).
    assert workers.wait_exit(worker, timeout=20) == 0
    row = job(tables, stalled)
    assert row.status == "queued"
    ((entry),) = row.attempt_history
    assert (entry["attempt"], entry["outcome"]) == (1, "retried"), row.attempt_history
    assert entry["error"]["type"] == "sa_jobqueue.errors.HardTimeoutError"
    with tables.connect() as conn:
        assert conn.execute(sa.select(j.max_attempts).where(j.id == stalled)).scalar_one() == 3
    assert effects(tables, stalled) == []
