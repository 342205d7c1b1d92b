"""Connections that fail under running workers: the worker stays live, every job still ends.

Real ``sa-jobqueue worker`` subprocesses drain jobs that write through ``ctx.session`` while
the test breaks their connections: ``pg_terminate_backend`` on direct connections, a PgBouncer
restart behind ``--pooler transaction``. Each job must end ``succeeded`` within a bound, with
its effect written exactly once; no handler thread may be left unable to run jobs.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sa_jobqueue.database import CONTROL_USERS, create_control_engine, create_engine
from sa_jobqueue.models import jobs_table
from tests.apps import network
from tests.helpers.jobs import job_row, reading, statuses
from tests.helpers.poolers import PGBOUNCER, PgBouncer, SilentProxy, pgbouncer
from tests.helpers.processes import WorkerApp, Workers
from tests.helpers.waiting import wait_for

WORKER_APP = WorkerApp("tests.apps.network:queue", log_level="INFO")
TABLES = network.metadata
j = jobs_table.c

needs_pgbouncer = pytest.mark.skipif(
    PGBOUNCER is None, reason="pgbouncer is not installed (Debian package pgbouncer)"
)


def enqueue(url: URL, task: str, n: int) -> list[int]:
    engine = create_engine(url)
    try:
        with Session(engine) as session, session.begin():
            ids = network.queue.enqueue_many(session, task, [{"n": i} for i in range(n)])
            return [int(i) for i in ids]
    finally:
        engine.dispose()


def terminate_workers_backends(bind: sa.Engine | sa.Connection) -> int:
    """Terminate every server connection of the workers on this test's database; how many."""
    with reading(bind) as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    " AND application_name = 'sa_jobqueue'"
                )
            ).scalar_one()
        )


def succeeded(engine: sa.Engine | sa.Connection, ids: list[int]) -> int:
    return statuses(engine, ids)["succeeded"]


def effects_per_job(engine: sa.Engine) -> collections.Counter[int]:
    with engine.connect() as conn:
        return collections.Counter(conn.execute(sa.select(network.effects.c.job_id)).scalars())


def drained(engine: sa.Engine, ids: list[int], workers: Workers, timeout: float) -> None:
    """Wait until every job of ``ids`` succeeded; fail with their statuses and the logs."""
    try:
        workers.wait(lambda: statuses(engine, ids) == {"succeeded": len(ids)}, timeout)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {statuses(engine, ids)}\n{workers.all_output()}") from None


def assert_all_succeeded_once(engine: sa.Engine, ids: list[int], workers: Workers) -> None:
    done = statuses(engine, ids)
    assert done == {"succeeded": len(ids)}, f"{done}\n{workers.all_output()}"
    effects = effects_per_job(engine)
    assert sorted(effects) == sorted(ids)
    assert set(effects.values()) == {1}, "a job's effect was written twice"


def during_drain(
    engine: sa.Engine, ids: list[int], workers: Workers, fault: Callable[[], object], times: int
) -> None:
    """Inject ``fault`` ``times`` times while the workers are part way through ``ids``.

    Not before every worker has started: a worker whose first connection fails refuses to
    start, as it should, and on a loaded machine one was still starting when the first
    fault came (the others had drained the first part without it)."""
    workers.wait_registered(workers.procs, timeout=60)
    for k in range(1, times + 1):
        part = k * len(ids) // (times + 2)
        workers.wait(lambda: succeeded(engine, ids) >= part, timeout=60)  # noqa: B023
        fault()


@pytest.mark.slow
def test_terminated_backends_during_a_writing_drain_leave_every_thread_serving(
    tables: sa.Engine, database_url: URL, workers: Workers
) -> None:
    ids = enqueue(database_url, "write_briefly", 3_000)
    for _ in range(2):
        workers.start(concurrency=4)
    during_drain(tables, ids, workers, lambda: terminate_workers_backends(tables), times=4)
    # The bound: the drain itself, plus one short lease for a job whose outcome was lost.
    drained(tables, ids, workers, timeout=40)
    assert_all_succeeded_once(tables, ids, workers)
    # And every thread still serves: a second batch drains at once.
    more = enqueue(database_url, "write_briefly", 200)
    drained(tables, more, workers, timeout=20)
    workers.terminate_all()


@needs_pgbouncer
@pytest.mark.slow
def test_a_pgbouncer_restart_during_a_writing_drain_leaves_every_thread_serving(
    tables: sa.Engine, database_url: URL, server_url: URL, tmp_path: Path
) -> None:
    bouncer = PgBouncer(server_url, "transaction")
    pooled = bouncer.url(database_url)
    workers = Workers(WORKER_APP, pooled, tmp_path)
    try:
        ids = enqueue(database_url, "write_briefly", 3_000)
        for _ in range(2):
            workers.start("--pooler", "transaction", concurrency=4)

        def restart() -> None:
            nonlocal bouncer
            port = bouncer.port
            bouncer.stop()
            time.sleep(0.1)  # the outage itself, not synchronisation: 0.1 s down
            bouncer = PgBouncer(server_url, "transaction", port=port)

        during_drain(tables, ids, workers, restart, times=2)
        drained(tables, ids, workers, timeout=40)
        assert_all_succeeded_once(tables, ids, workers)
        more = enqueue(database_url, "write_briefly", 200)
        drained(tables, more, workers, timeout=20)
        workers.terminate_all()
    finally:
        workers.kill_all()
        bouncer.stop()


def test_connections_give_up_on_unacknowledged_data(database_url: URL) -> None:
    """libpq's tcp_user_timeout is on: a statement sent to a vanished peer is not retried by
    the kernel for a quarter of an hour."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            driver = conn.connection.dbapi_connection
            assert driver is not None
            assert driver.info.get_parameters()["tcp_user_timeout"] == "60000"
    finally:
        engine.dispose()


def test_a_producers_engine_survives_terminated_connections(
    tables: sa.Engine, database_url: URL
) -> None:
    """Engines from create_engine check a pooled connection before handing it out."""
    producer = create_engine(database_url, connect_args={"application_name": "producer"})
    try:
        for _ in range(3):
            with Session(producer) as session, session.begin():
                network.queue.enqueue(session, "write", {})
            with tables.connect() as conn:
                killed = conn.execute(
                    sa.text(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                        " WHERE datname = current_database() AND application_name = 'producer'"
                    )
                ).scalar_one()
            assert killed == 1
        # The first statement on each terminated connection still succeeds: a fresh one serves.
        with Session(producer) as session, session.begin():
            network.queue.enqueue(session, "write", {})
        assert statuses(tables) == {"queued": 4}
    finally:
        producer.dispose()


def set_connections(server: sa.Engine, database: str, allowed: bool) -> None:
    """Let new connections into ``database``, or refuse them (those open stay open)."""
    with server.begin() as conn:
        conn.execute(
            sa.text(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS {str(allowed).lower()}')
        )


def test_every_user_of_a_workers_own_connections_gets_one_at_once(database_url: URL) -> None:
    """The claim loop's and the completer's connections (held), the heartbeat's, the
    registry's, the main thread's, and one per job thread recording an outcome, all at once:
    none waits for the pool, where no statement deadline (nor a stopping worker's clock)
    would cut the wait. Before, the pool had room for two fewer and the next one waited
    out the pool's 30 s timeout."""
    control = create_control_engine(database_url, concurrency=3)
    try:
        with contextlib.ExitStack() as held:
            for _ in range(CONTROL_USERS + 3):
                held.enter_context(control.connect())
    finally:
        control.dispose()


def test_a_job_whose_commit_lost_its_connection_runs_again_at_once_not_after_its_lease(
    tables: sa.Engine, database_url: URL, workers: Workers
) -> None:
    """The handler's connection is terminated before its commit: the attempt's writes and
    its outcome are lost. Its lease is ended on a fresh connection, so the next claim takes
    the job over within moments, not once its minute-long lease runs out."""
    workers.start(concurrency=2, poll=0.2)
    (job_id,) = enqueue(database_url, "write_then_lose_it", 1)
    try:
        workers.wait(lambda: statuses(tables, [job_id]) == {"succeeded": 1}, timeout=20)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {job_row(tables, job_id)}\n{workers.all_output()}") from None
    assert job_row(tables, job_id).attempts == 2
    with tables.connect() as conn:
        effects = conn.execute(
            sa.select(network.effects.c.attempt).where(network.effects.c.job_id == job_id)
        ).scalars()
        assert list(effects) == [2]  # the first attempt's write was lost with its commit
    workers.terminate_all()


@pytest.mark.slow
def test_outcomes_are_recorded_once_the_server_accepts_connections_again(
    tables: sa.Engine,
    database_url: URL,
    server_url: URL,
    workers: Workers,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A brief refusal of new connections loses no outcome: each is written once the server
    accepts connections again, so no job runs more often than its own outcome says."""
    runs = tmp_path / "runs"
    monkeypatch.setenv("SAJQ_TEST_RUNS_FILE", str(runs))
    server = create_engine(server_url.set(database="postgres"), poolclass=sa.pool.NullPool)
    # The failing ones first: the outage lands while failures and completions are written.
    failing = enqueue(database_url, "fail_once_briefly", 500)
    touches = enqueue(database_url, "touch_briefly", 1_500)
    ids = failing + touches
    with tables.connect() as watcher:  # opened before the refusal: it keeps working
        workers.start("--prefetch", "2", concurrency=3)
        workers.wait(lambda: statuses(watcher, ids)["queued"] <= 1_700, timeout=30)
        set_connections(server, database_url.database or "", allowed=False)
        try:
            assert terminate_workers_backends(watcher) > 0
            time.sleep(2.0)  # the outage itself, not synchronisation: 2 s of refusals
        finally:
            set_connections(server, database_url.database or "", allowed=True)
        try:
            workers.wait(lambda: succeeded(watcher, ids) == len(ids), 40)
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}: {statuses(watcher, ids)}\n{workers.all_output()}"
            ) from None
    server.dispose()
    executions = collections.Counter(
        int(line.split()[0]) for line in runs.read_text().split("\n") if line
    )
    again = {i: executions[i] for i in touches if executions[i] != 1}
    again.update({i: executions[i] for i in failing if executions[i] != 2})
    assert not again, f"{len(again)} jobs ran more or fewer times than they should"
    workers.terminate_all()


@pytest.mark.slow
def test_a_handlers_pooled_connection_that_went_silent_is_replaced(
    tables: sa.Engine, database_url: URL, tmp_path: Path
) -> None:
    proxy = SilentProxy(database_url)
    workers = Workers(WORKER_APP, proxy.url(database_url), tmp_path)
    try:
        workers.start(concurrency=2)
        # Busy first, so that the handlers' pool holds connections, idle between jobs.
        warm = enqueue(database_url, "write", 40)
        drained(tables, warm, workers, timeout=30)
        assert proxy.silence() >= 2
        ids = enqueue(database_url, "write", 5)  # directly: the database itself is fine
        # Each pooled connection is pinged (15 s deadline) and replaced before a handler gets it.
        drained(tables, ids, workers, timeout=45)
        assert set(effects_per_job(tables).values()) == {1}
        workers.terminate_all(timeout=40)
    finally:
        workers.kill_all()
        proxy.close()


def test_a_handler_past_its_timeout_loses_its_connection_and_its_thread_goes_on(
    tables: sa.Engine, database_url: URL, workers: Workers
) -> None:
    """A handler's statement that never answers is cut once the task's timeout has passed:
    its attempt is recorded as timed out, and its thread runs the next job."""
    workers.start(concurrency=1)
    hung = enqueue(database_url, "hang", 1)
    with tables.connect() as conn:
        wait_for(lambda: statuses(conn, hung) == {"running": 1}, timeout=20)
    after = enqueue(database_url, "write", 3)
    started = time.monotonic()
    drained(tables, after, workers, timeout=30)
    assert time.monotonic() - started < 20  # not the minute the statement would take
    row = job_row(tables, hung[0])
    assert row.status == "dead"
    assert "timeout" in (row.last_error or {}).get("message", ""), row.last_error
    workers.terminate_all()


@needs_pgbouncer
def test_a_worker_behind_a_transaction_pooler_without_the_option_says_what_to_pass(
    tables: sa.Engine, database_url: URL, server_url: URL, tmp_path: Path
) -> None:
    """Without ``--pooler transaction``, psycopg's prepared statements land on other server
    connections; the worker stops with the option to pass, instead of retrying for ever."""
    with pgbouncer(server_url, "transaction") as bouncer:
        workers = Workers(WORKER_APP, bouncer.url(database_url), tmp_path)
        try:
            enqueue(database_url, "write", 300)
            procs = [workers.start(concurrency=4) for _ in range(2)]
            for proc in procs:
                workers.signalled.add(proc.pid)  # they are expected to exit
                code = workers.wait_exit(proc, timeout=60)
                assert code == 1, workers.output(proc)
                assert "--pooler transaction" in workers.output(proc)
        finally:
            workers.kill_all()


def sleeping_handlers(engine: sa.Engine) -> int:
    """Handlers' backends running ``pg_sleep`` on this test's database."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND state = 'active' AND query LIKE '%pg_sleep%'"
                    " AND application_name = 'sa_jobqueue' AND pid <> pg_backend_pid()"
                )
            ).scalar_one()
        )


@pytest.mark.slow
@pytest.mark.parametrize("task", ["sleep_in_session", "sleep_in_batch_session"])
def test_a_handler_whose_connection_goes_silent_mid_statement_is_freed(
    tables: sa.Engine,
    database_url: URL,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    task: str,
) -> None:
    """No timeout on the task: the server finished the statement, its answer was swallowed.
    The worker sees its handler waiting on a backend that is not working for it, cuts that
    connection, and the job runs again (its lease is no longer renewed for ever). A batch
    task's handler is found in the batch's session, as a job's in its own."""
    runs = tmp_path / "runs"
    monkeypatch.setenv("SAJQ_TEST_RUNS_FILE", str(runs))
    proxy = SilentProxy(database_url)
    workers = Workers(WORKER_APP, proxy.url(database_url), tmp_path)
    try:
        workers.start(concurrency=1)
        with Session(tables) as session, session.begin():
            job = network.queue.enqueue(session, task, {"seconds": 2})
        workers.wait(lambda: sleeping_handlers(tables) == 1, timeout=20)
        assert proxy.silence() >= 1
        drained(tables, [job], workers, timeout=40)
        attempts = [line.split()[1] for line in runs.read_text().splitlines()]
        assert attempts == ["1", "2"]
        workers.terminate_all(timeout=40)
    finally:
        workers.kill_all()
        proxy.close()


def test_a_worker_whose_startup_check_loses_its_connection_starts_all_the_same(
    tables: sa.Engine, database_url: URL
) -> None:
    """A backend terminated while the worker checks the schema is a passing fault: the check
    is tried again on a fresh connection and the worker starts and runs its jobs."""
    from sa_jobqueue import Worker

    ids = enqueue(database_url, "write", 3)
    engine = create_engine(database_url, connect_args={"application_name": "starting"})
    terminated: list[int] = []

    def terminate_after_first_read(conn: sa.Connection, *args: object) -> None:
        # Once, after the check's first statement: its next one meets a terminated backend.
        if not terminated:
            terminated.append(terminate_application(tables, "starting"))

    sa.event.listen(engine, "after_cursor_execute", terminate_after_first_read)
    try:
        worker = Worker(network.queue, engine, concurrency=2, poll_interval=timedelta(seconds=0.2))
        assert worker.run(burst=True)
    finally:
        engine.dispose()
    assert terminated == [1]
    assert statuses(tables, ids) == {"succeeded": 3}


def terminate_application(bind: sa.Engine, application: str) -> int:
    """Terminate the server connections of ``application`` on this test's database."""
    with bind.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND application_name = :app"
                ),
                {"app": application},
            ).scalar_one()
        )


@pytest.mark.slow
def test_a_worker_whose_startup_check_meets_a_silent_connection_starts_all_the_same(
    tables: sa.Engine, database_url: URL
) -> None:
    """The schema check at start runs under the worker's statement deadline: a connection
    gone silent under it is cut, and the check is tried again on a fresh one."""
    from sa_jobqueue import Worker

    ids = enqueue(database_url, "write", 2)
    proxy = SilentProxy(database_url)
    engine = create_engine(proxy.url(database_url))
    silenced: list[int] = []

    def silence_after_first_read(conn: sa.Connection, *args: object) -> None:
        if not silenced:  # once: the check's next statement waits on a silent peer
            silenced.append(proxy.silence())

    sa.event.listen(engine, "after_cursor_execute", silence_after_first_read)
    worker = Worker(network.queue, engine, concurrency=2, poll_interval=timedelta(seconds=0.2))
    outcome: list[bool] = []
    thread = threading.Thread(target=lambda: outcome.append(worker.run(burst=True)), daemon=True)
    try:
        thread.start()
        thread.join(timeout=45)
        assert outcome == [True], "the worker hung on its silent startup connection"
    finally:
        if thread.is_alive():
            worker.stop()
        proxy.close()
        engine.dispose()
    assert silenced
    assert silenced[0] >= 1
    assert statuses(tables, ids) == {"succeeded": 2}
