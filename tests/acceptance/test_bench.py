"""The benchmark: its harness end to end with tiny sizes, its report, and the docs' table.

The peers are installed only in bench/.venv; here the harness itself is checked with
sa_jobqueue and the SQL reference: every scenario runs, every drain is verified exactly-once
and measured for CPU, and the raw result is written. The docs' Performance table must be what
its committed raw result renders to, and only a full run may feed it.
"""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import URL

from bench import readme_table, report
from tests.helpers.databases import url_string
from tests.helpers.processes import REPO_ROOT

ROOT = REPO_ROOT


@pytest.mark.slow
@pytest.mark.timeout(500)  # some thirty drains, each paying worker start-up and stop
def test_every_scenario_runs_and_verifies_with_tiny_sizes(server_url: URL, tmp_path: Path) -> None:
    env = {**os.environ, "DATABASE_URL": url_string(server_url)}
    # Every drain pays about a second and a half of worker start-up, warm-up and stop, which
    # the sizes barely change: the count of drains and of their worker processes is the cost.
    # Only the no-op drains check a process count (1 and 2); the rest run one process each.
    result = subprocess.run(
        [sys.executable, "bench/bench.py", "--quick", "--repeat", "1",
         "--systems", "sa_jobqueue,reference", "--drain-procs", "1,2",
         "--write-procs", "1", "--procs", "1",
         "--single", "20", "--bulk", "200", "--drain", "300", "--latency-jobs", "5",
         "--latency-rate", "50", "--history", "2000", "--history-drain", "300",
         "--pinned", "500", "--backlog", "500,3000", "--backlog-drain", "1000",
         "--scale-procs", "1,2", "--scale-drain", "300",
         "--max-drain-seconds", "30", "--results-dir", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (path,) = tmp_path.glob("*.json")
    document = json.loads(path.read_text())
    scenarios = document["scenarios"]
    assert set(scenarios) == {
        "enqueue", "bulk", "drain", "write", "latency", "history", "pinned", "backlog",
        "batch-write", "async", "scale",
    }  # fmt: skip
    for rows in scenarios.values():
        for row in rows:
            assert row["error"] is None, row
            assert row["failures"] == 0, row
            assert row["medians"], row
    assert document["full_run"] is False
    assert document["command"].startswith("python bench/bench.py --quick")
    # Every drain of a full run.
    for name in report.DRAINS:
        for row in scenarios[name]:
            for run in row["runs"]:
                assert run["verified"], run
                assert run["complete"], run
                assert run["ready"] == "idle", run
                assert run["worker_cpu_seconds"] >= 0, run
            if row["system"] == "sa_jobqueue":
                # Measured in clock ticks (10 ms): a few hundred jobs add up to some.
                assert sum(run["worker_cpu_seconds"] for run in row["runs"]) > 0, row
    backlog = {row["system"]: row for row in scenarios["backlog"]}
    for row in backlog.values():
        # The small backlog is drained whole; the larger one is not: the workers are stopped
        # once 1,000 have started, as the harness sees it by reading the handlers' records
        # every few milliseconds. On a loaded machine it sees that late, and a drain of
        # thousands of jobs a second starts many more meanwhile (2,251 of 3,000 once, with a
        # model-checker run beside the suite).
        *small, large = row["runs"]
        assert len(small) == 2, small  # 1,000 jobs to drain: two drains of the 500
        assert {(r["measure"], r["finished"]) for r in small} == {("500", 500)}, small
        assert large["measure"] == "3k", large
        assert large["finished"] < large["jobs"], large
        assert large["db_cpu_seconds"] is not None, large
    # The scale scenario: each drain at each count, with the backends' waits sampled.
    for row in scenarios["scale"]:
        runs = row["runs"]
        assert [r["measure"] for r in runs] == [
            f"{kind} {p}p" for kind in ("noop", "write", "batch_write") for p in (1, 2)
        ]
        # A drain of 300 jobs may end within one 20 ms interval; the writing ones do not.
        assert all(r["waits"]["samples"] >= 0 and "states" in r["waits"] for r in runs), runs
        if row["system"] == "sa_jobqueue":
            assert sum(r["waits"]["samples"] for r in runs) > 0, runs
    assert "Sampled backends" in report.render_scenario("scale", document)
    drains = {row["system"]: row for row in scenarios["drain"]}
    assert {r["measure"] for r in drains["sa_jobqueue"]["runs"]} == {"1p", "2p"}
    assert drains["sa_jobqueue"]["ratios"]["2p"]["vs_reference"] > 0


def _document(**rates: float) -> dict[str, Any]:
    """A small raw result: a no-op drain at 1 process, a rate per system."""
    systems = {
        "sa_jobqueue": {"label": "sa_jobqueue", "config": "c", "peer": False},
        "pgqueuer": {"label": "pgqueuer", "config": "c", "peer": True},
        "pgqueuer_b100": {"label": "pgqueuer (batch_size=100)", "config": "c", "peer": True},
        "reference": {"label": "reference", "config": "c", "peer": False},
    }
    rows = [
        {"system": key, "error": None, "failures": 0, "notes": [],
         "medians": {"1p": rate, "1p worker cpu": 30.0, "1p db cpu": 20.0}}
        for key, rate in rates.items()
    ]  # fmt: skip
    return {
        "command": "bench/run --publish",
        "full_run": True,
        "git": {"commit": "0" * 40, "dirty": False},
        "started": "2026-01-01T00:00:00+00:00",
        "minutes": 40.0,
        "info": {
            "cores": 2,
            "cpu": "cpu",
            "postgresql": "15",
            "settings": {"fsync": "on"},
            "load_average": {"start": 0.1, "end": 0.2},
        },
        "options": {"drain_procs": [1], "drain": 20_000, "repeat": 3},
        "systems": systems,
        "sizes": {},
        "scenarios": {"drain": rows},
    }


def test_ratios_are_to_the_best_peer_configuration_and_to_the_reference() -> None:
    document = _document(sa_jobqueue=30_000, pgqueuer=10_000, pgqueuer_b100=20_000,
                         reference=60_000)  # fmt: skip
    report.add_ratios(document)
    assert document["best_peer"]["drain"]["1p"] == {"system": "pgqueuer_b100", "value": 20_000}
    sa = document["scenarios"]["drain"][0]
    assert sa["ratios"]["1p"] == {"vs_best_peer": 1.5, "vs_reference": 0.5}
    table = readme_table.render_table(document, "bench/runs/x.json")
    assert "| drain 20,000 no-op jobs, 1 process | 30,000 |" in table
    assert "pgqueuer (batch_size=100): 20,000" in table
    times = "\N{MULTIPLICATION SIGN}"
    assert f"| 1.50{times} | 0.50{times} |" in table


def test_a_failed_or_broken_peer_is_never_the_best_one() -> None:
    document = _document(sa_jobqueue=30_000, pgqueuer=10_000, pgqueuer_b100=90_000)
    document["scenarios"]["drain"][2]["failures"] = 1
    report.add_ratios(document)
    assert document["best_peer"]["drain"]["1p"]["system"] == "pgqueuer"
    assert math.isclose(document["scenarios"]["drain"][0]["ratios"]["1p"]["vs_best_peer"], 3.0)


def test_the_async_scenario_is_in_a_full_run_and_shows_async_rates_against_sync_ones() -> None:
    from bench import bench as runner

    assert "async" in runner.parse_args([]).scenarios  # part of a full run: the docs show it
    medians = {"noop sync": 2_000.0, "noop async": 3_000.0, "write sync": 400.0,
               "write async": 100.0, "1ms sync": 1_000.0, "1ms async": 1_000.0}  # fmt: skip
    document = _document(sa_jobqueue=1.0)
    document["scenarios"] = {
        "async": [{"system": "sa_jobqueue", "error": None, "failures": 0, "notes": [],
                   "medians": medians}]
    }  # fmt: skip
    document["sizes"] = {"async": "(3,000 jobs)"}
    report.add_ratios(document)
    lines = report.render_scenario("async", document).splitlines()
    # (jobs/s, vs sync) of each line: the rate is 8th from the end, before the ratios and CPU.
    cells = [(line.split()[-8], line.split()[-2]) for line in lines if line.endswith(" ok")]
    assert cells == [("2,000", "-"), ("3,000", "1.50x"), ("400", "-"), ("100", "0.25x"),
                     ("1,000", "-"), ("1,000", "1.00x")]  # fmt: skip
    # The docs' table: each async line's rate, with its ratio to its sync twin's.
    document["options"]["async_concurrency"] = 16
    table = readme_table.render_table(document, "bench/runs/x.json")
    times = "\N{MULTIPLICATION SIGN}"
    assert "| drain 20,000 jobs, 1 process, 16 at once: noop, sync | 2,000 |" in table
    write = "| drain 20,000 jobs, 1 process, 16 at once: write, async |"
    assert f"{write} 100 (0.25{times} sync) |" in table


def test_only_a_full_run_feeds_the_docs() -> None:
    document = _document(sa_jobqueue=1.0, pgqueuer=1.0)
    partial = copy.deepcopy(document)
    partial["full_run"] = False
    with pytest.raises(readme_table.NotAFullRun):
        readme_table.render_table(partial, "bench/runs/x.json")
    from bench import bench as runner

    with pytest.raises(SystemExit):
        runner.parse_args(["--quick", "--publish"])
    with pytest.raises(SystemExit):
        runner.parse_args(["--scenarios", "drain", "--publish"])
    assert runner.parse_args(["--publish"]).publish


def test_the_docs_performance_table_is_what_its_committed_raw_result_renders_to() -> None:
    pages = [p for p in readme_table.PAGES if p.exists() and "<!-- bench-table:" in p.read_text()]
    assert pages, "the Performance page holds no bench-table block"
    for page in pages:
        for match in readme_table.BLOCK.finditer(page.read_text()):
            source = match["source"]
            if source != readme_table.NO_RUN:
                assert (ROOT / source).is_file(), f"{page}: {source} is not committed"
                assert source.startswith("bench/runs/"), source
        assert readme_table.stale(page) == [], f"{page}: run bench/readme_table.py"
