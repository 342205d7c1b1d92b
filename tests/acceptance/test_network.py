"""Real deployments' networks: PgBouncer in transaction and session mode, and silent connections.

The PgBouncer tests run the Debian ``pgbouncer`` binary with its stock settings (see
:mod:`tests.helpers.poolers`); on a machine without it they are skipped with the reason (CI installs
it, so they always run there). The silent-connection test puts a TCP proxy between the worker
processes and PostgreSQL and, once the workers are busy, makes every connection they hold
forward nothing while still accepting new ones.
"""

from __future__ import annotations

import collections
import signal
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sa_jobqueue import JobQueue, Worker, _deadlines
from sa_jobqueue._deadlines import guard_statements
from sa_jobqueue._sql.retention import PRUNE_LOCK
from sa_jobqueue.database import CONTROL_SETTINGS, create_control_engine, create_engine
from sa_jobqueue.models import jobs_table, workers_table
from sa_jobqueue.worker import STOP_MARGIN
from sa_jobqueue.worker._sessions import GroupSession, group_engine
from sa_jobqueue.worker._signals import EXIT_SLACK
from tests.apps import network
from tests.helpers.jobs import statuses
from tests.helpers.poolers import PGBOUNCER, PgBouncer, SilentProxy, pgbouncer
from tests.helpers.processes import WorkerApp, Workers, listen_backends, run_cli
from tests.helpers.waiting import wait_for

APP = WorkerApp("tests.apps.network:queue", log_level="INFO")
TABLES = network.metadata
j = jobs_table.c

needs_pgbouncer = pytest.mark.skipif(
    PGBOUNCER is None, reason="pgbouncer is not installed (Debian package pgbouncer)"
)


@pytest.fixture
def transaction_pooler(server_url: URL) -> Iterator[PgBouncer]:
    with pgbouncer(server_url, "transaction") as bouncer:
        yield bouncer


def enqueue_through(url: URL, task: str, n: int, **engine_options: object) -> list[int]:
    engine = create_engine(url, **engine_options)  # type: ignore[arg-type]
    try:
        with Session(engine) as session, session.begin():
            return network.queue.enqueue_many(session, task, [{"n": i} for i in range(n)])
    finally:
        engine.dispose()


def effects_per_job(engine: sa.Engine) -> collections.Counter[int]:
    with engine.connect() as conn:
        return collections.Counter(conn.execute(sa.select(network.effects.c.job_id)).scalars())


@needs_pgbouncer
@pytest.mark.slow
def test_workers_and_the_cli_run_through_pgbouncer_in_transaction_mode(
    tables: sa.Engine, database_url: URL, transaction_pooler: PgBouncer, tmp_path: Path
) -> None:
    pooled = transaction_pooler.url(database_url)
    workers = Workers(APP, pooled, tmp_path)
    try:
        # Enqueued through the pooler too: the single way and the bulk way.
        ids = enqueue_through(pooled, "write", 1_990, pooler="transaction")
        engine = create_engine(pooled, pooler="transaction")
        try:
            for _ in range(10):
                with Session(engine) as session, session.begin():
                    ids.append(network.queue.enqueue(session, "write", {}))
        finally:
            engine.dispose()
        for _ in range(2):
            workers.start("--pooler", "transaction", concurrency=8)
        workers.wait(lambda: statuses(tables, ids) == {"succeeded": 2_000}, timeout=150)
        effects = effects_per_job(tables)
        assert sorted(effects) == sorted(ids)
        assert set(effects.values()) == {1}  # every job's row written exactly once
        for command in ("stats", "check", "migrate"):
            done = run_cli(
                command,
                "--database-url",
                str(pooled.render_as_string(False)),
                "--pooler",
                "transaction",
            )
            assert done.returncode == 0, (command, done.stdout, done.stderr)
        workers.terminate_all()
    finally:
        workers.kill_all()


@needs_pgbouncer
def test_settings_apply_per_transaction_and_never_reach_the_poolers_next_client(
    database_url: URL, server_url: URL
) -> None:
    # One server connection: whatever our transactions left on it, the next client would see.
    with pgbouncer(server_url, "transaction", pool_size=1) as bouncer:
        url = bouncer.url(database_url).update_query_dict({"options": "-c search_path=pg_catalog"})
        control = create_control_engine(url, concurrency=2, pooler="transaction")
        plain = create_engine(bouncer.url(database_url), pooler="transaction")
        try:
            with control.connect() as conn:
                for _ in range(3):  # each statement its own transaction, each with the settings
                    seen = {
                        name: conn.execute(sa.select(sa.func.current_setting(name))).scalar_one()
                        for name in [*CONTROL_SETTINGS, "search_path"]
                    }
                    assert seen == {**CONTROL_SETTINGS, "search_path": "pg_catalog"}
            with plain.connect() as conn:
                assert conn.exec_driver_sql("SHOW statement_timeout").scalar_one() == "0"
                assert conn.exec_driver_sql("SHOW search_path").scalar_one() != "pg_catalog"
            # The limits hold: a statement over its statement timeout is cancelled.
            brief = create_engine(url, pooler="transaction", settings={"statement_timeout": "50ms"})
            with brief.connect() as conn, pytest.raises(sa.exc.OperationalError, match="timeout"):
                conn.execute(sa.select(sa.func.pg_sleep(2)))
            brief.dispose()
        finally:
            control.dispose()
            plain.dispose()


@needs_pgbouncer
def test_grouped_jobs_get_the_engines_settings_behind_a_transaction_pooler(
    database_url: URL, transaction_pooler: PgBouncer
) -> None:
    # A group's first savepoint is its transaction's first statement: it must go through the
    # engine's events, which put the settings in the transaction.
    engine = create_engine(
        transaction_pooler.url(database_url),
        pooler="transaction",
        settings={"statement_timeout": "4321ms"},
    )
    try:
        with group_engine(engine).connect() as conn, conn.begin():
            for _ in range(3):  # three jobs' savepoints in one group transaction
                session = GroupSession(conn)
                shown = session.execute(sa.text("SHOW statement_timeout")).scalar_one()
                session.commit_for_real()
                session.close()
                assert shown == "4321ms"
    finally:
        engine.dispose()


@needs_pgbouncer
def test_pruning_is_one_at_a_time_behind_a_transaction_pooler(
    database_url: URL, transaction_pooler: PgBouncer
) -> None:
    """Retention's lock is a transaction-level advisory lock: it holds through the pooler."""
    queue = JobQueue()

    @queue.task
    def noop(ctx: object, payload: object) -> None:
        pass

    direct = create_engine(database_url)
    engine = create_engine(transaction_pooler.url(database_url), pooler="transaction")
    try:
        with Session(direct) as session, session.begin():
            ids = queue.enqueue_many(session, noop, [{}] * 3)
        worker = Worker(queue, engine, retention=timedelta(0))
        assert worker.listen is False  # LISTEN needs a session: the poll serves instead
        with direct.connect() as holder, holder.begin():
            holder.execute(sa.select(sa.func.pg_advisory_xact_lock(PRUNE_LOCK)))
            worker.run(burst=True)  # prunes at every poll, but another session holds the lock
            assert statuses(direct, ids) == {"succeeded": 3}
            assert worker.prune() == 0  # and it does not wait for it
        assert worker.prune() == 3
    finally:
        engine.dispose()
        direct.dispose()


@pytest.mark.parametrize("moment", ["delete", "commit"])
def test_pruning_on_a_connection_gone_silent_is_cut_at_the_statement_deadline(
    tables: sa.Engine, database_url: URL, monkeypatch: pytest.MonkeyPatch, moment: str
) -> None:
    """Pruning runs on the claim loop's thread, between claim rounds: a pruning statement
    that waits for ever on a silent connection would stop the worker claiming (and, once
    told to stop, exiting). It is cut at the worker's statement deadline, as every statement
    of the worker's own is: its DELETE, and the COMMIT that ends its transaction."""
    monkeypatch.setattr(_deadlines, "STATEMENT_DEADLINE", 1.0)
    queue = JobQueue()
    proxy = SilentProxy(database_url)
    engine = create_engine(proxy.url(database_url), pool_size=1, max_overflow=0)
    try:
        worker = Worker(queue, engine, retention=timedelta(0))

        # The network goes silent inside the pruning transaction, once its lock is taken
        # (before that, the pool's ping at checkout finds a connection gone silent): at its
        # DELETE, or as it commits.
        @sa.event.listens_for(engine, "before_cursor_execute")
        def silence_at_the_delete(*args: object) -> None:
            if moment == "delete" and "DELETE" in str(args[2]):
                proxy.silence()

        @sa.event.listens_for(engine, "commit")
        def silence_at_the_commit(conn: object) -> None:
            if moment == "commit":
                proxy.silence()

        pruned: list[BaseException | int] = []
        pruning = threading.Thread(target=lambda: pruned.append(_outcome(worker.prune)))
        pruning.start()
        assert proxy.swallowed.wait(10), "no pruning statement was sent"
        pruning.join(10)
        assert not pruning.is_alive(), "pruning still waits on its silent connection"
        assert isinstance(pruned[0], sa.exc.OperationalError)
    finally:
        engine.dispose()
        proxy.close()


def _outcome(call: Callable[[], int]) -> BaseException | int:
    try:
        return call()
    except BaseException as exc:  # what the pruning thread met, for the test to look at
        return exc


@needs_pgbouncer
def test_the_default_mode_works_through_pgbouncer_in_session_mode(
    tables: sa.Engine, database_url: URL, server_url: URL, tmp_path: Path
) -> None:
    """No startup options: PgBouncer refuses them in either mode. LISTEN works in this one."""
    with pgbouncer(server_url, "session") as bouncer:
        pooled = bouncer.url(database_url)
        workers = Workers(APP, pooled, tmp_path)
        try:
            workers.start(concurrency=2, poll=30)  # a wake-up can only come from NOTIFY
            wait_for(lambda: listen_backends(tables), timeout=20)
            ids = enqueue_through(pooled, "write", 20)
            workers.wait(lambda: statuses(tables, ids) == {"succeeded": 20}, timeout=20)
            done = run_cli("stats", "--database-url", pooled.render_as_string(False))
            assert done.returncode == 0, done.stderr
            workers.terminate_all()
        finally:
            workers.kill_all()


def _registered(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(workers_table)).scalar_one())


@pytest.mark.slow
def test_workers_ride_out_connections_that_go_silent(
    tables: sa.Engine,
    database_url: URL,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runs = tmp_path / "runs"
    monkeypatch.setenv("SAJQ_TEST_RUNS_FILE", str(runs))
    proxy = SilentProxy(database_url)
    workers = Workers(APP, proxy.url(database_url), tmp_path)
    try:
        for _ in range(2):
            workers.start(concurrency=4, poll=0.2)
        # Busy first, so that every kind of connection a worker holds is open: the claim
        # loop's, the completer's, the listener's, the heartbeat's and the registry's.
        workers.wait(lambda: len(listen_backends(tables)) == 2 and _registered(tables) == 2, 30)
        warm = enqueue_through(database_url, "touch", 40)
        workers.wait(lambda: statuses(tables, warm) == {"succeeded": 40}, timeout=30)
        # Two workers, each with its claim loop's, completer's, listener's and registry's.
        assert proxy.silence() >= 6
        ids = enqueue_through(database_url, "touch", 200)  # directly: the database itself is fine
        try:
            workers.wait(lambda: statuses(tables, ids) == {"succeeded": 200}, timeout=90)
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}: {statuses(tables, ids)}\n{workers.all_output()}"
            ) from None
        executions = collections.Counter(
            int(line.split()[0]) for line in runs.read_text().splitlines()
        )
        assert all(executions[i] == 1 for i in ids), "a job ran twice"
        with tables.connect() as conn:
            attempts = set(conn.execute(sa.select(j.attempts).where(j.id.in_(ids))).scalars())
        assert attempts == {1}
        # How soon a stopping worker exits is the next test's; here it need only exit cleanly,
        # within its grace (30 s), STOP_MARGIN and EXIT_SLACK. It once did not exit at all:
        # its claim loop's pruning sent its COMMIT as the network went silent, and a COMMIT
        # had no deadline (test_pruning_on_a_connection_gone_silent_... shows it).
        workers.terminate_all(timeout=30 + STOP_MARGIN + EXIT_SLACK)
    finally:
        workers.kill_all()
        proxy.close()


@pytest.mark.slow
def test_a_worker_told_to_stop_on_silent_connections_exits_within_its_grace_and_margin(
    tables: sa.Engine, database_url: URL, tmp_path: Path
) -> None:
    """SIGTERM while a claim waits on a silent connection and two handlers outlast the
    grace: the worker exits within its grace and ``STOP_MARGIN`` (with status 1, jobs were
    still running), not once the claim's full statement deadline (15 s) has passed."""
    proxy = SilentProxy(database_url)
    workers = Workers(APP, proxy.url(database_url), tmp_path)
    try:
        worker = workers.start("--shutdown-grace", "2s", concurrency=4, poll=0.2)
        workers.wait(lambda: len(listen_backends(tables)) == 1 and _registered(tables) == 1, 30)
        with Session(tables) as session, session.begin():
            slow = network.queue.enqueue_many(
                session, "write_after_a_while", [{"seconds": 60}, {"seconds": 60}]
            )
        workers.wait(lambda: statuses(tables, slow) == {"running": 2}, timeout=30)
        assert proxy.silence() >= 3
        # Two threads are free and a job is due, so the claim loop's next claim goes into
        # the void (or, at the latest, the heartbeat's next renewal does).
        enqueue_through(database_url, "write", 1)
        assert proxy.swallowed.wait(20), "no statement was sent on a silent connection"
        stopped = time.monotonic()
        workers.signal(worker, signal.SIGTERM)
        code = workers.wait_exit(worker, timeout=60)
        took = time.monotonic() - stopped
        assert took <= 2 + STOP_MARGIN, f"exited after {took:.1f}s:\n{workers.output(worker)}"
        assert code == 1, workers.output(worker)
    finally:
        workers.kill_all()
        proxy.close()


@pytest.mark.slow
@pytest.mark.parametrize("silence", ["silence_next", "silence_next_once_ready"])
def test_a_starting_worker_whose_first_connection_goes_silent_starts_all_the_same(
    tables: sa.Engine, database_url: URL, tmp_path: Path, silence: str
) -> None:
    """The first connection a starting burst opens goes silent: before the server's first
    answer (``silence_next``: ``--wait-for-database 10`` tries again within its patience
    instead of spending all of it in libpq's 10 s connect timeout), or right after the
    handshake (``silence_next_once_ready``: SQLAlchemy's own first statement, the server's
    version, is cut at the ping's deadline instead of waiting for ever). Either way the
    worker connects again and runs its job."""
    proxy = SilentProxy(database_url)
    getattr(proxy, silence)(1)
    workers = Workers(APP, proxy.url(database_url), tmp_path)
    try:
        (job_id,) = enqueue_through(database_url, "write", 1)
        burst = workers.start("--burst", "--wait-for-database", "10", concurrency=1)
        code = workers.wait_exit(burst, timeout=40)
        assert code == 0, workers.output(burst)
        assert statuses(tables, [job_id]) == {"succeeded": 1}
    finally:
        workers.kill_all()
        proxy.close()


def test_a_statement_cut_at_its_deadline_discards_its_connection(database_url: URL) -> None:
    """The deadline's own mechanism, on a direct connection: a statement that overstays is
    cut, raises a connection error at once, and its connection never goes back to the pool."""
    control = create_control_engine(database_url, concurrency=1)
    guarded = control.execution_options()
    guard_statements(guarded, 0.5)
    try:
        with guarded.connect() as conn:
            before = conn.connection.dbapi_connection
            with pytest.raises(sa.exc.OperationalError):
                conn.execute(sa.select(sa.func.pg_sleep(5)))
            assert conn.invalidated
        with guarded.connect() as conn:
            assert conn.connection.dbapi_connection is not before
            assert conn.execute(sa.select(1)).scalar_one() == 1
    finally:
        control.dispose()


@needs_pgbouncer
@pytest.mark.slow
def test_verify_runs_through_pgbouncer_in_transaction_mode(
    database_url: URL, transaction_pooler: PgBouncer
) -> None:
    pooled = transaction_pooler.url(database_url).render_as_string(hide_password=False)
    done = run_cli(
        "verify", "--database-url", pooled, "--pooler", "transaction", "--jobs", "300",
        "--workers", "2", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
