"""The worker subprocesses of a verify run: the real ``sa-jobqueue worker`` command."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Final

from sqlalchemy.engine import URL

from ..database import POOLER_ENV
from .names import PARENT_ENV, QUEUE, SCHEMA_ENV, WORKER_APP
from .report import Settings

#: Seconds a worker gets to finish its running jobs after the run's SIGTERM, and how much
#: longer verify waits for it before SIGKILL.
SHUTDOWN_GRACE: Final = 10.0


class WorkerProcesses:
    """The worker subprocesses: the real ``sa-jobqueue worker`` command, each with a log file."""

    def __init__(self, url: URL, schema: str, settings: Settings, logs: Path) -> None:
        self.settings = settings
        self.logs = logs
        self.procs: list[subprocess.Popen[bytes]] = []
        self.killed: set[int] = set()
        self.told: set[int] = set()  # SIGTERMed by stop(): they exit, as told
        self.unexpected: list[str] = []
        self._reported: set[int] = set()
        # The URL goes in the environment, not on the command line, where `ps` shows it.
        self.env = {
            **os.environ,
            "DATABASE_URL": url.render_as_string(hide_password=False),
            SCHEMA_ENV: schema,
            PARENT_ENV: str(os.getpid()),
            POOLER_ENV: settings.pooler,
        }

    def start(self) -> subprocess.Popen[bytes]:
        command = [
            sys.executable,
            "-m",
            "sa_jobqueue",
            "--log-level",
            "WARNING",
            "worker",
            WORKER_APP,
            "--concurrency",
            str(self.settings.concurrency),
            "--queues",
            QUEUE,
            # Never prune: the finished rows are the evidence, and the prune lock is an
            # advisory lock shared with your own workers.
            "--retention",
            "forever",
            "--shutdown-grace",
            str(SHUTDOWN_GRACE),
        ]
        if not self.settings.listen:
            command.append("--no-listen")
        with (self.logs / f"worker-{len(self.procs)}.log").open("wb") as out:
            proc = subprocess.Popen(
                command,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                # A Ctrl-C at the terminal reaches verify alone, which then stops the workers
                # and drops the schema in order.
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    @property
    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        self.killed.add(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def check_exits(self) -> None:
        """Note workers that exited without being told to (with the last line of their log)."""
        for i, proc in enumerate(self.procs):
            code = proc.poll()
            if code is None or proc.pid in self.killed | self.told | self._reported:
                continue
            self._reported.add(proc.pid)
            lines = (self.logs / f"worker-{i}.log").read_text(errors="replace").splitlines()
            last = lines[-1].strip() if lines else "(no output)"
            self.unexpected.append(f"worker {proc.pid} exited with status {code}: {last}")

    def stop(self) -> None:
        """SIGTERM the workers still running; SIGKILL those that outlast their grace."""
        alive = self.alive
        for proc in alive:
            self.told.add(proc.pid)
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + SHUTDOWN_GRACE + 5
        for proc in alive:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self.check_exits()
