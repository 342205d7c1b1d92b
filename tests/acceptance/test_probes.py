"""The worker's probes, ``sa-jobqueue worker --health-port``, answering and failing when they
should, in real worker processes: readiness fails while the database cannot be reached and
liveness does not; liveness fails while the claim loop is stuck on a lock, and readiness does
not; both come back with the database."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import URL

from sa_jobqueue.database import create_engine
from tests.helpers.poolers import SilentProxy, free_port
from tests.helpers.processes import WorkerApp, Workers

WORKER_APP = WorkerApp("tests.apps.acceptance:queue", log_level="INFO")


def probe(port: int, path: str) -> tuple[int, str]:
    """GET ``path`` from the worker's probe port: the status code and the body's line (0 and
    the reason while nothing listens there yet)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            return answer.status, answer.read().decode().strip()
    except urllib.error.HTTPError as failed:
        return failed.code, failed.read().decode().strip()
    except urllib.error.URLError as unreachable:
        return 0, str(unreachable.reason)


def test_probes_fail_when_they_should_and_come_back(database_url: URL, tmp_path: Path) -> None:
    """One worker, two faults. The database out of reach (its connections terminated, new ones
    refused): readiness fails, liveness does not (the loops go on retrying; a restart would not
    help). Then a lock held on the jobs table (as a migration's ALTER TABLE holds one) stalls
    the claim loop in its pruning (``--retention 0`` prunes at every poll), which waits on the
    lock with no timeout: liveness fails naming the loop, readiness does not. The stall bound,
    3 s, is above the waits between claims in an outage this short (0.12 s, doubling each
    try: 2 s at the fifth); the default bound covers the longest (5 s) and more."""
    proxy = SilentProxy(database_url)
    workers = Workers(WORKER_APP, proxy.url(database_url), tmp_path)
    port = free_port()
    direct = create_engine(database_url, poolclass=sa.pool.NullPool)
    options = ("--health-port", str(port), "--retention", "0", "--stalled-after", "3s")
    try:
        proc = workers.start(*options, concurrency=1, poll=0.1)
        workers.wait_registered([proc])  # its loops run (before they do, /livez says alive)
        assert probe(port, "/livez") == (200, "alive")
        workers.wait(lambda: probe(port, "/readyz") == (200, "ready"), timeout=10)
        assert probe(port, "/nowhere")[0] == 404

        proxy.refuse(True)
        with direct.connect() as conn:
            conn.execute(TERMINATE_OTHERS)
        _, text = workers.wait(lambda: _failing(probe(port, "/readyz")), timeout=10)
        assert text.startswith("the database does not answer"), text
        assert probe(port, "/livez") == (200, "alive")
        proxy.refuse(False)
        workers.wait(lambda: probe(port, "/readyz") == (200, "ready"), timeout=10)

        with direct.connect() as conn, conn.begin():
            conn.exec_driver_sql("LOCK TABLE sa_jobqueue_jobs IN ACCESS EXCLUSIVE MODE")
            _, text = workers.wait(lambda: _failing(probe(port, "/livez")), timeout=15)
            assert text.startswith("stalled (claim loop: no turn for"), text
            assert "heartbeat" not in text  # it goes on beating (and renewing, had it jobs)
            assert probe(port, "/readyz") == (200, "ready")
        workers.wait(lambda: probe(port, "/livez") == (200, "alive"), timeout=10)
        workers.assert_alive(proc)
        workers.terminate_all(timeout=30)
    finally:
        workers.kill_all()
        proxy.close()
        direct.dispose()


TERMINATE_OTHERS = sa.text(
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
)


def _failing(answer: tuple[int, str]) -> tuple[int, str] | None:
    return answer if answer[0] == 503 else None
