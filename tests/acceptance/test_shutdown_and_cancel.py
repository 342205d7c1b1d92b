"""Acceptance tests of timeouts, cancellation and shutdown on real ``sa-jobqueue worker``s.

Job timeouts (a handler that watches ``ctx.stop_requested`` and one that ignores it), the
cancellation of a running and of a queued job, a graceful SIGTERM with jobs in every phase, and
a second signal that exits at once.

The workers load ``tests.apps.lifecycle:queue``; its handlers record every execution in an
autocommit audit table (``lifecycle_runs``, which also notes when a handler returned and which
flags it had seen) and write their effect through ``ctx.session`` (``lifecycle_effects``). The
tests synchronise only on state they poll with a deadline (job rows, audit rows,
``pg_stat_activity``, process exit), and kill every process they start.
"""

from __future__ import annotations

import signal
import time
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sa_jobqueue._sql.claiming import LEASE_EXPIRED
from sa_jobqueue.models import jobs_table
from sa_jobqueue.worker import STOP_MARGIN
from sa_jobqueue.worker._signals import EXIT_SLACK
from tests.apps import lifecycle
from tests.apps.lifecycle import effects, runs
from tests.helpers import jobs
from tests.helpers.jobs import executions, job_row, statuses
from tests.helpers.processes import (
    WorkerApp,
    Workers,
    committed_effects,
    listen_backends,
)
from tests.helpers.waiting import wait_for

TIMEOUT_ERROR = "builtins.TimeoutError"
j = jobs_table.c
#: The committed effects of one job: [(attempt, pid)], oldest first.
effect_rows = partial(committed_effects, effects)
WORKER_APP = WorkerApp("tests.apps.lifecycle:queue", log_level="INFO")
TABLES = lifecycle.metadata
enqueue = partial(jobs.enqueue, queue=lifecycle.queue)
enqueue_many = partial(jobs.enqueue_many, queue=lifecycle.queue)
audit = partial(executions, runs)


# -- helpers -------------------------------------------------------------------------------------


def cancel(engine: sa.Engine, job_id: int) -> bool:
    """``queue.cancel`` in a Session of the test's own, committed."""
    with Session(engine) as session:
        found = lifecycle.queue.cancel(session, job_id)
        session.commit()
    return found


def state(engine: sa.Engine, job_id: int) -> tuple[str, int]:
    row = job_row(engine, job_id)
    return row.status, row.attempts


def error_type(row: sa.Row[Any]) -> str | None:
    return row.last_error["type"] if row.last_error else None


def attempts_run(engine: sa.Engine, job_id: int) -> list[int]:
    return [r.attempt for r in audit(engine, job_id)]


# -- 1. a handler that honours its timeout: every attempt fails, the job dies --------------------


@pytest.mark.slow
def test_timed_out_attempts_roll_back_and_the_job_dies(tables: sa.Engine, workers: Workers) -> None:
    engine = tables
    task = lifecycle.queue.tasks["overrun"]
    assert task.timeout == timedelta(seconds=1)
    assert task.max_attempts == 2
    worker = workers.start(concurrency=4, poll=0.1)
    job_id = enqueue(engine, "overrun")
    # The effect is already in attempt 1's open transaction once its audit row shows.
    workers.wait(lambda: attempts_run(engine, job_id) == [1], timeout=20)

    # The worker keeps serving other jobs while the slow one runs into its timeouts.
    meanwhile = enqueue_many(engine, "quick", [{"n": n} for n in range(5)])
    workers.wait(lambda: statuses(engine, meanwhile) == {"succeeded": 5}, timeout=10)

    workers.wait(lambda: job_row(engine, job_id).status not in ("queued", "running"), timeout=15)
    row = job_row(engine, job_id)
    assert (row.status, row.attempts) == ("dead", 2), (row, workers.all_output())
    assert error_type(row) == TIMEOUT_ERROR, row.last_error
    assert "timeout" in row.last_error["message"]
    # The quick jobs finished long before the slow one gave up for good.
    with engine.connect() as conn:
        latest_quick = conn.execute(
            sa.select(sa.func.max(j.finished_at)).where(j.id.in_(meanwhile))
        ).scalar_one()
    assert latest_quick < row.finished_at

    # Both attempts were told to stop, returned, and had their writes rolled back.
    workers.wait(lambda: all(r.returned for r in audit(engine, job_id)), timeout=10)
    after = enqueue_many(engine, "quick", [{"n": n} for n in range(3)])
    workers.wait(lambda: statuses(engine, after) == {"succeeded": 3}, timeout=10)
    workers.assert_alive(worker)
    workers.terminate_all()  # exit 0: every attempt's outcome was recorded or fenced out

    executions = audit(engine, job_id)
    assert [r.attempt for r in executions] == [1, 2]
    assert all(r.stop_seen and not r.cancel_seen for r in executions), executions
    # Each attempt ran about its timeout: not cut short, and stopped soon after it.
    assert all(0.9 <= float(r.ran_for) < 3.0 for r in executions), executions
    row = job_row(engine, job_id)
    assert (row.status, row.attempts, error_type(row)) == ("dead", 2, TIMEOUT_ERROR)
    assert effect_rows(engine, job_id) == []
    with engine.connect() as conn:
        done = set(conn.execute(sa.select(effects.c.job_id)).scalars())
    assert done == set(meanwhile) | set(after)


# -- 2. a sync handler that ignores its timeout: dead at once, its late return fenced out --------


@pytest.mark.slow
def test_handler_ignoring_its_timeout_cannot_complete_the_job(
    tables: sa.Engine, workers: Workers
) -> None:
    engine = tables
    sleep = 3.0
    workers.start(concurrency=2)
    job_id = enqueue(engine, "oblivious", {"seconds": sleep})
    workers.wait(lambda: attempts_run(engine, job_id) == [1], timeout=20)
    started = time.monotonic()

    # Dead once the 1 s timeout has passed, while the handler still sleeps.
    workers.wait(lambda: job_row(engine, job_id).status != "running", timeout=2.0)
    assert time.monotonic() - started < sleep - 0.5
    row = job_row(engine, job_id)
    assert (row.status, row.attempts) == ("dead", 1), (row, workers.all_output())
    assert error_type(row) == TIMEOUT_ERROR, row.last_error
    assert 0.9 <= float(row.ran_for) < 2.0, row.ran_for
    assert not audit(engine, job_id)[0].returned

    # The handler wakes, writes its effect and returns; the completion must be fenced out.
    workers.wait(lambda: audit(engine, job_id)[0].returned, timeout=10)
    workers.terminate_all()  # exit 0 only after that completion attempt was made
    row = job_row(engine, job_id)
    assert (row.status, row.attempts, error_type(row)) == ("dead", 1, TIMEOUT_ERROR)
    assert effect_rows(engine, job_id) == []
    (execution,) = audit(engine, job_id)
    assert execution.stop_seen  # the flag was up; the handler just did not look
    assert float(execution.ran_for) >= sleep


# -- 3. cancellation of a running job and of a queued job ----------------------------------------


@pytest.mark.slow
def test_cancel_a_running_and_a_queued_job(tables: sa.Engine, workers: Workers) -> None:
    engine = tables
    lease = lifecycle.queue.tasks["cancellable"].lease.total_seconds()
    workers.start(concurrency=2, poll=0.2)
    scheduled = enqueue(engine, "quick", run_at=timedelta(hours=1))
    job_id = enqueue(engine, "cancellable")
    # The effect is already in the attempt's open transaction once its audit row shows.
    workers.wait(lambda: attempts_run(engine, job_id) == [1], timeout=20)

    assert cancel(engine, job_id) is True
    requested = time.monotonic()
    assert cancel(engine, scheduled) is True
    # The handler hears of it at the next lease renewal (every lease / 3).
    workers.wait(lambda: job_row(engine, job_id).status != "running", timeout=lease + 3)
    row = job_row(engine, job_id)
    assert (row.status, row.attempts) == ("cancelled", 1), (row, workers.all_output())
    assert row.finished_at is not None
    assert time.monotonic() - requested < lease + 3
    # The job ends cancelled only once its handler has returned.
    (execution,) = audit(engine, job_id)
    assert execution.returned
    assert (execution.cancel_seen, execution.stop_seen) == (True, True)
    assert effect_rows(engine, job_id) == []

    queued = job_row(engine, scheduled)
    assert (queued.status, queued.attempts) == ("cancelled", 0)
    assert queued.finished_at is not None

    # Not retried: wait until the cancelled attempt's lease would have run out, then let the
    # worker claim and finish a job after that; nothing else may have run.
    with engine.connect() as conn:
        wait_for(
            lambda: conn.execute(
                sa.select(j.visible_at < sa.func.clock_timestamp()).where(j.id == job_id)
            ).scalar_one(),
            timeout=lease + 5,
        )
    probe = enqueue(engine, "quick")
    workers.wait(lambda: job_row(engine, probe).status == "succeeded", timeout=10)
    workers.terminate_all()

    assert attempts_run(engine, job_id) == [1]
    assert audit(engine, scheduled) == []
    assert effect_rows(engine, scheduled) == []
    assert state(engine, job_id) == ("cancelled", 1)
    assert state(engine, scheduled) == ("cancelled", 0)
    assert not cancel(engine, job_id)  # a finished job stays as it is


# -- 4. SIGTERM with jobs in every phase ---------------------------------------------------------


@pytest.mark.slow
def test_sigterm_drains_running_jobs_and_leaves_the_rest_untouched(
    tables: sa.Engine, workers: Workers, tmp_path: Path
) -> None:
    engine = tables
    grace = 20.0
    worker = workers.start(
        "--shutdown-grace", str(grace), "--prefetch", "1", concurrency=2, poll=0.2
    )
    workers.wait(lambda: listen_backends(engine), timeout=20)

    # In backoff: failed once, its retry an hour away.
    backoff_id = enqueue(engine, "fails_first")
    workers.wait(lambda: state(engine, backoff_id) == ("queued", 1), timeout=20)
    backoff_before = job_row(engine, backoff_id)
    assert error_type(backoff_before) == "builtins.RuntimeError"
    # Running: both slots busy until the gates open.
    gates = [tmp_path / "gate-0", tmp_path / "gate-1"]
    running = [enqueue(engine, "gated", {"gate": str(gate)}) for gate in gates]
    workers.wait(lambda: all(attempts_run(engine, i) == [1] for i in running), timeout=20)
    # Due: claimed into the worker's one-job buffer, but no thread is free to start it. And
    # queued for a moment a few seconds ahead.
    due_id = enqueue(engine, "quick")
    future_id = enqueue(engine, "quick", run_at=timedelta(seconds=2))
    workers.wait(lambda: state(engine, due_id) == ("running", 1), timeout=20)
    assert audit(engine, due_id) == []
    assert not job_row(engine, future_id).due
    assert statuses(engine, running) == {"running": 2}

    workers.signal(worker, signal.SIGTERM)
    signalled = time.monotonic()
    # It has stopped claiming.
    wait_for(
        lambda: not listen_backends(engine), timeout=10, context=lambda: workers.output(worker)
    )
    # Let the future job come due while the worker is still draining.
    wait_for(lambda: job_row(engine, future_id).due, timeout=10)
    assert worker.poll() is None, workers.output(worker)  # the handlers are still blocked
    for gate in gates:
        gate.touch()

    code = workers.wait_exit(worker, timeout=grace + 5)
    assert code == 0, workers.output(worker)
    assert time.monotonic() - signalled < grace

    for job_id in running:
        row = job_row(engine, job_id)
        assert (row.status, row.attempts) == ("succeeded", 1), row
        assert [a for a, _ in effect_rows(engine, job_id)] == [1]
    # The buffered job was handed back as if never claimed; the future one never claimed.
    for job_id in (due_id, future_id):
        row = job_row(engine, job_id)
        assert (row.status, row.attempts, row.last_error) == ("queued", 0, None), row
        assert audit(engine, job_id) == []
    row = job_row(engine, backoff_id)
    assert (row.status, row.attempts) == ("queued", 1), row
    assert row.visible_at == backoff_before.visible_at
    assert row.last_error == backoff_before.last_error
    assert attempts_run(engine, backoff_id) == [1]
    assert effect_rows(engine, backoff_id) == []


# -- 5. a second signal exits at once; the job left running is reclaimed -------------------------


@pytest.mark.slow
def test_second_signal_exits_at_once_and_the_job_is_reclaimed(
    tables: sa.Engine, workers: Workers, tmp_path: Path
) -> None:
    engine = tables
    worker_a = workers.start("--shutdown-grace", "60", concurrency=2, poll=0.2)
    workers.wait(lambda: listen_backends(engine), timeout=20)
    job_id = enqueue(engine, "blocks_first", {"gate": str(tmp_path / "never-opened")})
    workers.wait(lambda: attempts_run(engine, job_id) == [1], timeout=20)

    workers.signal(worker_a, signal.SIGTERM)
    # The first signal was handled.
    wait_for(
        lambda: not listen_backends(engine), timeout=10, context=lambda: workers.output(worker_a)
    )
    assert worker_a.poll() is None, workers.output(worker_a)  # draining: the job still blocks
    later = enqueue(engine, "quick")  # it has stopped claiming

    worker_a.send_signal(signal.SIGTERM)
    second = time.monotonic()
    code = workers.wait_exit(worker_a, timeout=10)
    assert time.monotonic() - second < 2.0
    assert code == 128 + signal.SIGTERM, workers.output(worker_a)  # os._exit, not killed
    row = job_row(engine, job_id)
    assert (row.status, row.attempts) == ("running", 1)  # nobody told the database
    assert state(engine, later) == ("queued", 0)

    worker_b = workers.start(poll=0.2)
    workers.wait(lambda: job_row(engine, job_id).status != "running", timeout=15)
    row = job_row(engine, job_id)
    assert (row.status, row.attempts) == ("succeeded", 2), (row, workers.all_output())
    assert row.last_error["message"] == LEASE_EXPIRED  # taken back after the lease ran out
    workers.wait(lambda: job_row(engine, later).status == "succeeded", timeout=10)
    workers.terminate_all()
    executions = audit(engine, job_id)
    assert [(r.attempt, r.pid, r.returned) for r in executions] == [
        (1, worker_a.pid, False),
        (2, worker_b.pid, True),
    ]
    assert effect_rows(engine, job_id) == [(2, worker_b.pid)]


# -- 6. a timed-out attempt still running when its retry starts on the same worker ---------------


@pytest.mark.slow
def test_retry_started_beside_its_timed_out_attempt_still_times_out(
    tables: sa.Engine, workers: Workers, tmp_path: Path
) -> None:
    engine = tables
    gate = tmp_path / "gate"
    # One worker with a free slot: the retry lands beside the attempt that ignores its timeout.
    workers.start(concurrency=2, poll=0.1)
    job_id = enqueue(engine, "overlapping", {"gate": str(gate)})
    workers.wait(lambda: attempts_run(engine, job_id) == [1, 2], timeout=20)
    row = job_row(engine, job_id)
    assert (row.status, row.attempts) == ("running", 2), row
    assert error_type(row) == TIMEOUT_ERROR
    first = audit(engine, job_id)[0]
    assert not first.returned

    gate.touch()  # attempt 1 returns now, well within attempt 2's own timeout
    workers.wait(lambda: audit(engine, job_id)[0].returned, timeout=5)
    # Attempt 2 watches its flag: it must be timed out (and told so) like attempt 1 was.
    workers.wait(lambda: job_row(engine, job_id).status != "running", timeout=8)
    row = job_row(engine, job_id)
    assert (row.status, row.attempts) == ("dead", 2), (row, workers.all_output())
    assert error_type(row) == TIMEOUT_ERROR, row.last_error
    second = workers.wait(lambda: audit(engine, job_id)[1].returned, timeout=5)
    assert second
    assert audit(engine, job_id)[1].stop_seen
    workers.terminate_all()
    assert effect_rows(engine, job_id) == []


# -- 7. a handler that stops the moment it is told: its timeout still holds ----------------------


@pytest.mark.slow
def test_prompt_return_after_a_timeout_does_not_complete_the_job(
    tables: sa.Engine, workers: Workers
) -> None:
    engine = tables
    # CPU-bound work in small steps that returns as soon as ctx.stop_requested turns True, as
    # the README asks of long work: its completion races the worker's recording of the timeout.
    # (Test 1's handler writes an audit row before it returns, which gives the worker time.)
    workers.start(concurrency=2, poll=0.2)
    job_id = enqueue(engine, "crunch")
    workers.wait(lambda: attempts_run(engine, job_id) == [1], timeout=20)
    workers.wait(lambda: job_row(engine, job_id).status != "running", timeout=10)
    workers.terminate_all()  # exit 0: the attempt's outcome was recorded or fenced out

    row = job_row(engine, job_id)
    assert (row.status, row.attempts) == ("dead", 1), (row, workers.all_output())
    assert error_type(row) == TIMEOUT_ERROR, row.last_error
    assert effect_rows(engine, job_id) == []


@pytest.mark.slow
def test_a_stopping_worker_held_up_past_its_margin_exits_saying_where_it_was(
    tables: sa.Engine, database_url: URL, tmp_path: Path
) -> None:
    """SIGTERM, and the process is held up after the worker stopped (here an application's
    ``atexit`` hook that never returns): it exits with status 1 once its grace, STOP_MARGIN
    and EXIT_SLACK have passed, its threads' stacks written to its log first."""
    app = WorkerApp("tests.apps.stuck_exit:queue", log_level="INFO")
    workers = Workers(app, database_url, tmp_path)
    try:
        worker = workers.start("--shutdown-grace", "1s", concurrency=1)
        workers.wait_registered([worker])
        workers.signal(worker, signal.SIGTERM)
        code = workers.wait_exit(worker, timeout=1 + STOP_MARGIN + EXIT_SLACK + 30)
        assert code == 1, workers.output(worker)
        assert "flush_for_ever" in workers.output(worker)  # where the main thread was
    finally:
        workers.kill_all()
