"""The model checker's own audit: what it records must be true even after the faults it injects."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

#: A stand-in for a worker with a hard-limited task: it starts a forkserver that preloads the
#: model's tasks, has it start a child (as a hard-limited attempt's child is started), prints
#: its pid and dies by SIGKILL, before the child asks who its worker is.
WORKER = """
import multiprocessing, os, signal, sys
from tests.model.test_audit import report_worker_pid
context = multiprocessing.get_context("forkserver")
context.set_forkserver_preload(["tests.model.tasks"])
context.Process(target=report_worker_pid, args=sys.argv[1:]).start()
print(os.getpid(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def report_worker_pid(go: str, out: str) -> None:
    """In the child: once ``go`` exists, write the pid the audit names as its worker."""
    from tests.model.tasks import worker_pid

    deadline = time.monotonic() + 30
    while not Path(go).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    Path(out).write_text(str(worker_pid()))


def test_a_child_names_its_worker_after_the_worker_was_killed(tmp_path: Path) -> None:
    """Seed 920039: an attempt's child that starts as its worker is SIGKILLed is orphaned with
    its forkserver; the audit must still name the worker, not the process that adopted it."""
    go, out = tmp_path / "go", tmp_path / "pid"
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    with subprocess.Popen(
        [sys.executable, "-c", WORKER, str(go), str(out)],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    ) as worker:
        assert worker.stdout is not None
        pid = int(worker.stdout.readline())  # the child and its forkserver keep the pipe open
        assert worker.wait(timeout=60) == -9
        worker.stdout.close()
    go.touch()
    deadline = time.monotonic() + 30
    while not out.exists() or not out.read_text():
        assert time.monotonic() < deadline, "the child never answered"
        time.sleep(0.02)
    assert int(out.read_text()) == pid
