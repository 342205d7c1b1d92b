"""The harness of the acceptance tests: real ``sa-jobqueue`` commands, run as subprocesses.

:class:`Workers` starts ``python -m sa_jobqueue worker`` processes for one task module (a
:class:`WorkerApp`), keeps their logs, and terminates or kills them; the ``workers`` fixture in
tests/acceptance/conftest.py gives each test one, for the app its module names in
``WORKER_APP``. :func:`run_cli` runs one short command to its end. The queries at the end look at
what the workers did (the job readers are in :mod:`tests.helpers.jobs`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import URL

from sa_jobqueue.database import create_engine
from sa_jobqueue.models import jobs_table, workers_table
from tests.helpers.waiting import wait_for

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
#: The ``sa-jobqueue`` command, as the tests start it.
CLI = (sys.executable, "-m", "sa_jobqueue")
j = jobs_table.c
T = TypeVar("T")


def subprocess_env() -> dict[str, str]:
    """This process's environment, for a command that gets its database URL explicitly."""
    env = dict(os.environ)
    env.pop("DATABASE_URL", None)  # every command gets its URL explicitly
    return env


def run_cli(
    *args: str, executable: Sequence[str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m sa_jobqueue *args`` (or ``executable *args``) to its end, output captured."""
    command = list(executable or CLI)
    return subprocess.run(
        [*command, *args],
        cwd=REPO_ROOT,
        env=subprocess_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


@dataclass(frozen=True)
class WorkerApp:
    """What the worker subprocesses run: a ``module:attribute`` queue, and their log level."""

    target: str
    log_level: str


class Workers:
    """Starts ``python -m sa_jobqueue worker`` processes and kills whatever is left at the end.

    A worker the test signals through :meth:`signal` (or :meth:`terminate_all`) may exit;
    :meth:`assert_alive` and :meth:`wait` fail at once if any other worker has exited.
    """

    def __init__(self, app: WorkerApp, database_url: URL, logs: Path) -> None:
        self.app = app
        self.url = database_url.render_as_string(hide_password=False)
        self.logs = logs
        self.procs: list[subprocess.Popen[bytes]] = []
        self.log_files: dict[int, Path] = {}
        self.signalled: set[int] = set()  # pids the test told to stop: they may exit

    def start(
        self, *options: str, concurrency: int = 4, poll: float = 0.2
    ) -> subprocess.Popen[bytes]:
        log = self.logs / f"worker-{len(self.procs)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    *CLI,
                    "--log-level",
                    self.app.log_level,
                    "worker",
                    self.app.target,
                    "--database-url",
                    self.url,
                    "--concurrency",
                    str(concurrency),
                    "--poll-interval",
                    str(poll),
                    *options,
                ],
                cwd=REPO_ROOT,
                env=subprocess_env(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.log_files[proc.pid] = log
        self.procs.append(proc)
        return proc

    def signal(self, proc: subprocess.Popen[bytes], signum: int) -> None:
        """Send ``signum`` to a worker that may exit because of it."""
        self.signalled.add(proc.pid)
        proc.send_signal(signum)

    def output(self, proc: subprocess.Popen[bytes]) -> str:
        """The end of a worker's log, for assertion messages (never asserted on)."""
        return self.log_files[proc.pid].read_text(errors="replace")[-3000:]

    def all_output(self) -> str:
        return "\n".join(f"--- worker {p.pid}:\n{self.output(p)}" for p in self.procs)

    def assert_alive(self, *procs: subprocess.Popen[bytes]) -> None:
        """Fail (with its log) if one of ``procs``, by default every unsignalled worker, exited."""
        for proc in procs or [p for p in self.procs if p.pid not in self.signalled]:
            assert proc.poll() is None, f"worker {proc.pid} exited:\n{self.output(proc)}"

    def wait(self, predicate: Callable[[], T], timeout: float, interval: float = 0.02) -> T:
        """:func:`wait_for`, failing at once (with the logs) if an unsignalled worker exits."""

        def check() -> T:
            self.assert_alive()
            return predicate()

        return wait_for(check, timeout=timeout, interval=interval)

    def wait_exit(self, proc: subprocess.Popen[bytes], timeout: float) -> int:
        wait_for(lambda: proc.poll() is not None, timeout=timeout, interval=0.01)
        assert proc.returncode is not None
        return proc.returncode

    def terminate_all(self, timeout: float = 20.0) -> None:
        """SIGTERM the running workers and check that each exits 0.

        A worker exits 0 only once every handler it started has returned and its outcome has
        been recorded (or fenced out), so afterwards no attempt of theirs is still open.
        """
        alive = [p for p in self.procs if p.poll() is None]
        self.wait_registered(alive)
        for proc in alive:
            self.signal(proc, signal.SIGTERM)
        for proc in alive:
            code = self.wait_exit(proc, timeout)
            assert code == 0, f"worker {proc.pid} exited {code}:\n{self.output(proc)}"

    def wait_registered(
        self, procs: Sequence[subprocess.Popen[bytes]], timeout: float = 20.0
    ) -> None:
        """Wait until each of ``procs`` still running has its row in the worker registry.

        A worker writes that row once it runs, after the command has installed its signal
        handlers: a SIGTERM sent earlier, while the process is still importing the app, ends
        it with the default action (-15), not with the clean stop the caller checks for. A
        worker that cannot register (its database is down) is waited for no longer than
        ``timeout``; the caller's own check then says what happened.
        """
        engine = create_engine(self.url)
        try:

            def registered() -> bool:
                running = {p.pid for p in procs if p.poll() is None}
                if not running:
                    return True
                with engine.connect() as conn:
                    pids = set(conn.execute(sa.select(workers_table.c.pid)).scalars())
                return running <= pids

            with contextlib.suppress(AssertionError, sa.exc.DBAPIError):
                wait_for(registered, timeout=timeout)
        finally:
            engine.dispose()

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()  # SIGKILL also ends a process stopped with SIGSTOP
            proc.wait(timeout=10)


# -- queries -------------------------------------------------------------------------------------


def committed_effects(effects: sa.Table, engine: sa.Engine, job_id: int) -> list[tuple[int, int]]:
    """The committed effects of one job in a table with an ``id`` key: (attempt, pid)."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(effects.c.attempt, effects.c.pid)
            .where(effects.c.job_id == job_id)
            .order_by(effects.c.id)
        ).all()
    return [(r.attempt, r.pid) for r in rows]


def listen_backends(engine: sa.Engine) -> set[int]:
    """Pids of the backends of this test's database whose last statement was a LISTEN.

    A worker holds its LISTEN connection until it stops claiming: it closes it within half a
    second of the first SIGTERM, so its disappearance says the signal was handled.
    """
    with engine.connect() as conn:
        return set(
            conn.execute(
                sa.text(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                    " AND pid <> pg_backend_pid() AND query LIKE 'LISTEN%'"
                )
            ).scalars()
        )
