"""Every statement the dashboard's pages send reads a bounded part of the jobs table.

The pages are rendered over a table of finished history and a backlog (analysed, as autovacuum
would leave it), every statement they send is recorded with its parameters, and each is run
again under ``EXPLAIN (ANALYZE, FORMAT JSON)``: none may scan the jobs table from end to end,
and none may look at more of its rows (returned, or removed by a filter) than a window of ids
or one click's batch holds, however the planner chose to read them. The reference page lists
the same plans on a million rows (``python -m tests.helpers.dashboard_history``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from starlette.testclient import TestClient

from sa_jobqueue._sql import history
from sa_jobqueue.web import _actions, _reads, _workflow_reads, create_app
from tests.helpers.dashboard_history import (
    JOBS,
    PAGES,
    fill,
    fold_bounds,
    reads_jobs,
    recording,
)
from tests.helpers.pages import LOCAL

#: Finished jobs, and queued or running ones: 5%, as 20,000 beside a million make the
#: planner walk the primary key for a short page of the oldest queued jobs (10 here).
HISTORY = 40_000
BACKLOG = 2_000
#: The window of ids a page reads: a tenth of this history (50,000 is a twentieth of a
#: million). A window over the whole table would rightly be read end to end.
WINDOW = 4_000
#: The most rows of the jobs table one statement may look at: a window, or a purge's count of
#: one click's batch (MAX_BATCH + 1), patched to the same scale. A walk of the primary key
#: past the history (the oldest-first list of live jobs did one) looks at all 42,000.
BATCH = 4_000
MOST_EXAMINED = 2 * BATCH + 1_000
EDGES = "sa_jobqueue_dependencies"
#: The most edges one statement may look at: the chord has CHORD (1,000) of them; a page
#: counts (up to COUNTED, patched to MOST_JOBS here), lists and walks at most a few hundred.
MOST_EDGES = 3 * _workflow_reads.MOST_JOBS


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def on_jobs(node: dict[str, Any]) -> bool:
    """Whether a plan node reads rows of the jobs table (from it, or from an index alone).

    A bitmap index scan is left out: it gathers row addresses for the bitmap heap scan above
    it, which reads the rows and is counted (a BitmapAnd with the primary key's range can
    gather tens of thousands of addresses in a millisecond, for a few hundred rows).
    """
    return node.get("Relation Name") == JOBS


def examined(node: dict[str, Any]) -> int:
    """Rows a node looked at, in all its loops: those it returned and those it threw away."""
    per_loop = (
        node.get("Actual Rows", 0)
        + node.get("Rows Removed by Filter", 0)
        + node.get("Rows Removed by Index Recheck", 0)
    )
    return int(per_loop * node.get("Actual Loops", 1))


def test_every_page_reads_a_bounded_part_of_the_jobs_table(
    engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_reads, "SCAN_WINDOW", WINDOW)
    monkeypatch.setattr(_actions, "MAX_BATCH", BATCH)
    monkeypatch.setattr(_workflow_reads, "COUNTED", _workflow_reads.MOST_JOBS)
    ids = fill(engine, HISTORY, BACKLOG, spacing=5.0)  # 2.3 days: some created over 1d ago
    with (
        TestClient(create_app(engine, allow_actions=True), base_url=LOCAL) as client,
        recording(engine) as sent,
    ):
        for page in PAGES:
            assert client.get(page.format(**ids)).status_code == 200, page
    reading = [(s, p) for s, p in sent if reads_jobs(s)]
    assert len(reading) > len(PAGES)
    faults = []
    with engine.connect() as conn:
        # As the pages run them: page_settings() asks for no parallel workers.
        conn.exec_driver_sql("SET max_parallel_workers_per_gather = 0")
        for statement, parameters in reading:
            explain = f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}"
            top = conn.exec_driver_sql(explain, parameters).scalar()[0]["Plan"]
            reads = [n for n in nodes(top) if on_jobs(n)]
            looked = sum(examined(n) for n in reads)
            scans = [n for n in reads if n["Node Type"] == "Seq Scan"]
            if scans or not reads or looked > MOST_EXAMINED:
                faults.append(
                    f"{looked} rows looked at, {len(scans)} sequential scan(s):\n{statement}"
                    f"\n{parameters}\n{json.dumps(top, indent=1)}"
                )
    assert not faults, "\n\n".join(faults)
    with engine.connect() as conn:
        # The history's fold (the workers' upkeep) over one hour: 720 finishes, 5 s apart.
        fold = history.fold().compile(dialect=conn.dialect)
        params = fold.construct_params(fold_bounds(conn))
        top = conn.exec_driver_sql(f"EXPLAIN (ANALYZE, FORMAT JSON) {fold.string}", params)
        plan = top.scalar()[0]["Plan"]
        conn.rollback()
    reads = [n for n in nodes(plan) if on_jobs(n)]
    assert reads
    assert not [n for n in reads if n["Node Type"] == "Seq Scan"], json.dumps(plan, indent=1)
    assert sum(examined(n) for n in reads) <= 2 * 720, json.dumps(plan, indent=1)
    edges = [(s, p) for s, p in sent if EDGES in s and s.lstrip().upper().startswith("SELECT")]
    edges += [(s, p) for s, p in sent if EDGES in s and s.lstrip().upper().startswith("WITH")]
    assert edges
    with engine.connect() as conn:
        for statement, parameters in edges:
            explain = f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}"
            top = conn.exec_driver_sql(explain, parameters).scalar()[0]["Plan"]
            reads = [n for n in nodes(top) if n.get("Relation Name") == EDGES]
            looked = sum(examined(n) for n in reads)
            scans = [n for n in reads if n["Node Type"] == "Seq Scan"]
            # The chord's callback has CHORD edges: a page reads a bounded part of them.
            if scans or looked > MOST_EDGES:
                faults.append(
                    f"{looked} edges, {len(scans)} seq scan(s):\n{statement}\n{parameters}"
                    f"\n{json.dumps(top, indent=1)}"
                )
    assert not faults, "\n\n".join(faults)
