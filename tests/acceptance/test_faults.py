"""Fault-injection acceptance tests: real ``sa-jobqueue worker`` subprocesses ride out faults.

Long jobs kept alive by heartbeats, a worker frozen with SIGSTOP past its lease, a killed
LISTEN connection, poll-only mode, a PostgreSQL restart under running workers, and an
unreachable database at startup.

The workers load ``tests.apps.faults:queue``; its handlers record every execution in an
autocommit audit table (``fault_runs``) and write their exactly-once effect through
``ctx.session`` (``fault_effects``, which has no unique constraint on the job: only the fenced
completion can keep a stale attempt's effect out). The tests synchronise on state they poll
with a deadline (job rows, audit rows, ``pg_stat_activity``, process exit) and kill every
process and server they start.
"""

from __future__ import annotations

import functools
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import pytest
import sqlalchemy as sa

from sa_jobqueue._sql.claiming import LEASE_EXPIRED
from sa_jobqueue.database import create_engine, normalise_url
from sa_jobqueue.migrations import upgrade
from sa_jobqueue.models import jobs_table
from tests.apps import faults
from tests.apps.faults import effects, runs
from tests.helpers import jobs
from tests.helpers.jobs import executions, job_row, statuses, succeeded
from tests.helpers.processes import (
    WorkerApp,
    Workers,
    committed_effects,
    listen_backends,
    run_cli,
)
from tests.helpers.waiting import wait_for

WORKER_APP = WorkerApp("tests.apps.faults:queue", log_level="INFO")
TABLES = faults.metadata
j = jobs_table.c
enqueue = functools.partial(jobs.enqueue, queue=faults.queue)
enqueue_many = functools.partial(jobs.enqueue_many, queue=faults.queue)
audit = functools.partial(executions, runs)
#: The committed effects of one job: [(attempt, pid)], oldest first.
effect_rows = partial(committed_effects, effects)


# -- helpers -------------------------------------------------------------------------------------


def worker_backends(engine: sa.Engine) -> int:
    """How many connections the workers' engines hold on this test's database."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND application_name = 'sa_jobqueue' AND pid <> pg_backend_pid()"
                )
            ).scalar_one()
        )


# -- 1. heartbeats keep a job that runs ten times its lease ---------------------------------------


@pytest.mark.slow
def test_heartbeats_keep_a_job_ten_times_longer_than_its_lease(
    tables: sa.Engine, workers: Workers
) -> None:
    engine = tables
    lease = faults.queue.tasks["long_job"].lease.total_seconds()
    work = 10 * lease
    # Two workers polling every 0.2 s: if the runner's lease ever ran out, the other would
    # take the job over within moments (and so would the runner itself).
    procs = [workers.start(concurrency=2), workers.start(concurrency=2)]
    workers.wait(lambda: len(listen_backends(engine)) == 2, timeout=20)  # both are up and idle

    job_id = enqueue(engine, "long_job", {"seconds": work})
    workers.wait(lambda: len(audit(engine, job_id)) == 1, timeout=10)
    leases_seen: set[object] = set()

    def finished() -> bool:
        row = job_row(engine, job_id)
        if row.status == "running":
            leases_seen.add(row.visible_at)
            return False
        return True

    workers.wait(finished, timeout=work + 15, interval=0.1)
    workers.assert_alive()  # the other worker ran the whole time
    row = job_row(engine, job_id)
    assert row.status == "succeeded", (row, workers.all_output())
    assert row.attempts == 1
    assert row.last_error is None
    assert float(row.ran_for) >= work - 0.1  # it did run ten leases long
    # The lease (visible_at) moved forward again and again while the job ran: the heartbeat.
    assert len(leases_seen) >= 10, sorted(map(str, leases_seen))
    executions = audit(engine, job_id)
    assert [r.attempt for r in executions] == [1]  # ran exactly once
    assert executions[0].pid in {p.pid for p in procs}
    assert effect_rows(engine, job_id) == [(1, executions[0].pid)]
    workers.terminate_all()


# -- 2. a worker frozen past its lease: reclaimed, and its late completion fenced out ------------


def _state(pid: int) -> str:
    """The scheduler state of a process: "T" when stopped."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


def _busy_backends(engine: sa.Engine) -> int:
    """Statements of other sessions still executing on this test's database."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
                    " AND state = 'active'"
                )
            ).scalar_one()
        )


def _row_locked(engine: sa.Engine, job_id: int) -> bool:
    """True if some open transaction holds the job's row (we take and drop the lock at once)."""
    with engine.begin() as conn:
        mine = conn.execute(
            sa.select(j.id).where(j.id == job_id).with_for_update(skip_locked=True)
        ).first()
    return mine is None


def freeze(proc: subprocess.Popen[bytes], engine: sa.Engine, job_id: int) -> None:
    """SIGSTOP ``proc`` at a moment when it holds no lock on the job's row.

    A worker stopped between its lease renewal's UPDATE and its COMMIT keeps the row locked,
    and the claim's SKIP LOCKED then passes over the job until the worker resumes. That window
    is a millisecond or so per renewal; if the signal lands in it, thaw and try again.
    """
    for _ in range(10):
        proc.send_signal(signal.SIGSTOP)
        wait_for(lambda: _state(proc.pid) == "T", timeout=5)
        wait_for(lambda: not _busy_backends(engine), timeout=5)  # what it sent has run
        if not _row_locked(engine, job_id):
            return
        proc.send_signal(signal.SIGCONT)
        wait_for(lambda: not _row_locked(engine, job_id), timeout=5)
    raise AssertionError("could not freeze the worker outside a transaction on the job's row")


@pytest.mark.slow
def test_frozen_worker_is_fenced_out_after_sigcont(
    tables: sa.Engine, workers: Workers, tmp_path: Path
) -> None:
    engine = tables
    gate = tmp_path / "gate"
    job_id = enqueue(engine, "freezable", {"gate": str(gate)})
    worker_a = workers.start()
    # The audit row is written after the effect: A's write sits in its open transaction.
    workers.wait(lambda: len(audit(engine, job_id)) == 1, timeout=20)
    freeze(worker_a, engine, job_id)
    assert job_row(engine, job_id).status == "running"

    worker_b = workers.start()
    workers.wait(lambda: job_row(engine, job_id).status != "running", timeout=20)
    row = job_row(engine, job_id)
    assert (row.status, row.attempts) == ("succeeded", 2), workers.all_output()
    assert row.last_error["message"] == LEASE_EXPIRED  # B took it back from A, not A gave up
    assert _state(worker_a.pid) == "T"  # B finished while A was still frozen
    assert effect_rows(engine, job_id) == [(2, worker_b.pid)]

    # Wake A: its handler returns and it tries to complete attempt 1, which the fence rejects.
    gate.touch()
    worker_a.send_signal(signal.SIGCONT)
    workers.wait(lambda: audit(engine, job_id)[0].returned, timeout=20)
    workers.assert_alive()
    # A exits 0 only once its handler's future is done, i.e. after its completion attempt.
    workers.terminate_all()

    row = job_row(engine, job_id)
    assert (row.status, row.attempts) == ("succeeded", 2)
    assert effect_rows(engine, job_id) == [(2, worker_b.pid)]  # A's write was rolled back
    executions = audit(engine, job_id)
    assert [(r.attempt, r.pid) for r in executions] == [(1, worker_a.pid), (2, worker_b.pid)]
    assert all(r.returned for r in executions)  # both handlers ran to the end


@pytest.mark.slow
def test_a_frozen_workers_stale_attempt_releases_no_dependent(
    tables: sa.Engine, workers: Workers, tmp_path: Path
) -> None:
    """A job another waits for is frozen in its first attempt past its lease; the dependent
    stays waiting until the second attempt completes, runs once after it, and the first
    attempt's completion, sent when its worker wakes, is fenced out and changes nothing."""
    engine = tables
    gate = tmp_path / "gate"
    job_id = enqueue(engine, "freezable", {"gate": str(gate)})
    dependent = enqueue(engine, "effect", {"after": int(job_id)}, depends_on=[job_id])
    worker_a = workers.start()
    workers.wait(lambda: len(audit(engine, job_id)) == 1, timeout=20)
    freeze(worker_a, engine, job_id)
    assert job_row(engine, dependent).status == "waiting"

    worker_b = workers.start()
    workers.wait(lambda: job_row(engine, dependent).status == "succeeded", timeout=20)
    done = job_row(engine, job_id)
    assert (done.status, done.attempts) == ("succeeded", 2)
    with engine.connect() as conn:
        started = conn.execute(sa.select(j.started_at).where(j.id == dependent)).scalar_one()
    assert started > done.finished_at
    assert _state(worker_a.pid) == "T"  # all of it while the first attempt was frozen

    gate.touch()
    worker_a.send_signal(signal.SIGCONT)
    workers.wait(lambda: audit(engine, job_id)[0].returned, timeout=20)
    workers.terminate_all()
    assert (job_row(engine, job_id).attempts, job_row(engine, dependent).attempts) == (2, 1)
    assert effect_rows(engine, job_id) == [(2, worker_b.pid)]
    assert len(effect_rows(engine, dependent)) == 1


# -- 3. the LISTEN connection is killed: the worker reconnects and polls at once -----------------


@pytest.mark.slow
def test_listener_reconnects_after_its_backend_is_terminated(
    tables: sa.Engine, workers: Workers
) -> None:
    engine = tables
    poll = 30.0  # nothing in this test may rely on the poll
    worker = workers.start(poll=poll)
    first = workers.wait(lambda: listen_backends(engine), timeout=20)
    assert len(first) == 1
    (old_pid,) = first

    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.pg_terminate_backend(old_pid))).scalar_one()
    started = time.monotonic()
    # Enqueued while nobody listens: its NOTIFY is lost, the reconnect's wake-up must cover it.
    during_gap = enqueue(engine, "effect")
    assert not listen_backends(engine) - {old_pid}, "the listener came back before the enqueue"
    workers.wait(lambda: job_row(engine, during_gap).status == "succeeded", timeout=5)
    assert time.monotonic() - started < poll / 4

    def replaced() -> set[int]:
        now = listen_backends(engine)
        return now if now and old_pid not in now else set()

    assert len(workers.wait(replaced, timeout=10)) == 1
    started = time.monotonic()
    after = enqueue(engine, "effect")  # only a NOTIFY on the new connection can wake it now
    workers.wait(lambda: job_row(engine, after).status == "succeeded", timeout=5)
    assert time.monotonic() - started < poll / 4

    workers.assert_alive(worker)
    for job_id in (during_gap, after):
        assert job_row(engine, job_id).attempts == 1
        assert [a for a, _ in effect_rows(engine, job_id)] == [1]
    workers.terminate_all()


# -- 4. poll-only mode: no LISTEN connection at all ----------------------------------------------


@pytest.mark.slow
def test_poll_only_worker_never_listens(tables: sa.Engine, workers: Workers) -> None:
    engine = tables
    listening: set[int] = set()
    connected = False

    def done(ids: Sequence[int]) -> bool:
        nonlocal connected
        listening.update(listen_backends(engine))
        connected = connected or worker_backends(engine) > 0
        return statuses(engine, ids) == {"succeeded": len(ids)}

    worker = workers.start("--no-listen", poll=0.2)
    first = enqueue_many(engine, "effect", [{"n": n} for n in range(5)])
    workers.wait(lambda: done(first), timeout=20)
    second = [enqueue(engine, "effect", {"n": n}) for n in range(3)]
    workers.wait(lambda: done(second), timeout=10)

    assert connected  # the worker's connections were visible to the same query
    assert not listening
    assert not listen_backends(engine)
    workers.assert_alive(worker)
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(effects)).scalar_one() == 8
    workers.terminate_all()


# -- 5. PostgreSQL restarts under two busy workers -----------------------------------------------


@pytest.mark.slow
def test_workers_ride_out_a_postgresql_restart(tmp_path: Path) -> None:
    import pgserver

    total = 2_000
    # Not under pytest's tmp_path: see the comment in tests/conftest.py.
    datadir = tempfile.mkdtemp(prefix="sajq-restart-")
    server = None
    engine = None
    workers = None
    try:
        server = pgserver.get_server(datadir, cleanup_mode="stop")
        uri = server.get_uri()
        admin = create_engine(uri, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
        with admin.connect() as conn:
            conn.execute(sa.text("CREATE DATABASE sajq_restart"))
        admin.dispose()
        url = normalise_url(uri).set(database="sajq_restart")
        # No pool: the test keeps no connection across the restart.
        engine = create_engine(url, poolclass=sa.pool.NullPool)
        upgrade(engine)
        faults.metadata.create_all(engine)
        ids = enqueue_many(engine, "through_restart", [{"n": n} for n in range(total)])

        workers = Workers(WORKER_APP, url, tmp_path)
        procs = [workers.start(concurrency=8, poll=0.5) for _ in range(2)]
        workers.wait(lambda: succeeded(engine) >= 200, timeout=30, interval=0.05)
        before = succeeded(engine)
        assert before < total, "the jobs ran too fast to restart the server in the middle"

        server.cleanup()  # cleanup_mode="stop": pg_ctl stop (fast), the data stays
        with pytest.raises(sa.exc.OperationalError):
            engine.connect().close()
        time.sleep(3)  # the outage
        workers.assert_alive(*procs)
        server = pgserver.get_server(datadir, cleanup_mode="stop")
        assert server.get_uri() == uri  # same socket directory: the workers' URL still works

        workers.wait(lambda: succeeded(engine) == total, timeout=60, interval=0.25)
        workers.assert_alive(*procs)
        workers.terminate_all()

        assert statuses(engine) == {"succeeded": total}
        with engine.connect() as conn:
            per_job = dict(
                conn.execute(
                    sa.select(effects.c.job_id, sa.func.count()).group_by(effects.c.job_id)
                ).all()
            )
            mismatched = conn.execute(
                sa.select(sa.func.count())
                .select_from(jobs_table.join(effects, effects.c.job_id == j.id))
                .where(effects.c.attempt != j.attempts)
            ).scalar_one()
            audited = conn.execute(
                sa.select(sa.func.count(sa.distinct(j.id))).select_from(
                    jobs_table.join(
                        runs, sa.and_(runs.c.job_id == j.id, runs.c.attempt == j.attempts)
                    )
                )
            ).scalar_one()
            attempts = dict(
                conn.execute(sa.select(j.attempts, sa.func.count()).group_by(j.attempts)).all()
            )
            reclaimed = conn.execute(
                sa.select(sa.func.count()).where(j.last_error["message"].astext == LEASE_EXPIRED)
            ).scalar_one()
        print(
            f"\n{before} of {total} jobs had succeeded before the restart;"
            f" attempts per job: {attempts}; {reclaimed} reclaimed after a lost lease"
        )
        assert set(per_job) == set(ids)  # none lost
        assert set(per_job.values()) == {1}  # and exactly one effect each
        assert mismatched == 0  # the effect is the succeeding attempt's
        assert audited == total  # every succeeding attempt was an audited execution
    finally:
        if workers is not None:
            workers.kill_all()
        if engine is not None:
            engine.dispose()
        if server is not None:
            server.cleanup()
        shutil.rmtree(datadir, ignore_errors=True)


# -- 6. an unreachable database at startup -------------------------------------------------------


@pytest.mark.slow
def test_worker_exits_quickly_when_the_database_is_unreachable() -> None:
    started = time.monotonic()
    result = run_cli(
        "worker",
        "tests.apps.acceptance:queue",
        "--database-url",
        "postgresql://postgres@127.0.0.1:1/postgres",
    )
    elapsed = time.monotonic() - started
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("sa-jobqueue:"), result.stderr
    assert elapsed < 15, f"took {elapsed:.1f}s to give up"


# -- SIGTERM asks running handlers to stop ------------------------------------------------------


def test_sigterm_asks_running_handlers_to_stop_within_the_grace(
    tables: sa.Engine, workers: Workers
) -> None:
    """A handler that looks at ``ctx.stop_requested`` ends well within the grace after SIGTERM.

    One that then returns completes as usual; one that raises is handed back to the queue,
    its attempt uncounted and its writes rolled back, to run again on the next worker.
    """
    grace = 20
    proc = workers.start("--shutdown-grace", str(grace), concurrency=2)
    returns = enqueue(tables, "cooperative", {})
    gives_up = enqueue(tables, "cooperative", {"raise": True})
    workers.wait(lambda: len(audit(tables, returns)) == len(audit(tables, gives_up)) == 1, 20)
    workers.wait_registered([proc])
    started = time.monotonic()
    workers.signal(proc, signal.SIGTERM)
    code = workers.wait_exit(proc, timeout=grace + 10)
    took = time.monotonic() - started
    assert code == 0, workers.output(proc)
    assert took < grace / 2, f"took {took:.1f}s to stop"
    assert job_row(tables, returns).status == "succeeded"
    assert effect_rows(tables, returns) == [(1, proc.pid)]
    handed_back = job_row(tables, gives_up)
    # Its attempt keeps its number (the fence of that attempt alone) and is given back.
    assert (handed_back.status, handed_back.attempts) == ("queued", 1), handed_back
    assert handed_back.max_attempts == 6, handed_back
    assert handed_back.last_error is None
    assert effect_rows(tables, gives_up) == []
