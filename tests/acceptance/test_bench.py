"""The benchmark harness runs end to end with tiny sizes (sa_jobqueue and the SQL reference).

The peers are installed only in bench/.venv; here the harness itself is checked: every
scenario runs, every drain is verified exactly-once, and the results file is written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy.engine import URL

from tests.helpers.databases import url_string
from tests.helpers.processes import REPO_ROOT

ROOT = REPO_ROOT


@pytest.mark.slow
def test_every_scenario_runs_and_verifies_with_tiny_sizes(server_url: URL, tmp_path: Path) -> None:
    env = {**os.environ, "DATABASE_URL": url_string(server_url)}
    result = subprocess.run(
        [sys.executable, "bench/bench.py", "--quick", "--repeat", "1",
         "--systems", "sa_jobqueue,reference",
         "--single", "20", "--bulk", "200", "--drain", "300", "--latency-jobs", "5",
         "--latency-rate", "50", "--history", "2000", "--history-drain", "300",
         "--pinned", "500", "--max-drain-seconds", "30", "--results-dir", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (path,) = tmp_path.glob("*.json")
    scenarios = json.loads(path.read_text())["scenarios"]
    assert set(scenarios) == {"enqueue", "bulk", "drain", "write", "latency", "history", "pinned"}
    for rows in scenarios.values():
        for row in rows:
            assert row["error"] is None, row
            assert row["failures"] == 0, row
            assert row["medians"], row
