"""Every statement the dashboard's pages send reads the jobs table through an index.

The pages are rendered over a table of finished history (analysed, as autovacuum would leave
it), every statement they send is recorded with its parameters, and each is explained as the
server would run it: none may scan the jobs table from end to end. The how-to page lists the
same plans on a million rows (``python -m tests.helpers.dashboard_history``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from starlette.testclient import TestClient

from sa_jobqueue.web import _reads, create_app
from tests.helpers.dashboard_history import JOBS, PAGES, fill, reads_jobs, recording
from tests.helpers.pages import LOCAL


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def test_every_page_reads_the_jobs_table_through_an_index(
    engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The window of ids a page reads, as small beside this history as 200,000 ids are beside
    # a million jobs: a window over the whole table would rightly be read end to end.
    monkeypatch.setattr(_reads, "SCAN_WINDOW", 8_000)
    ids = fill(engine, 40_000)
    with (
        TestClient(create_app(engine, allow_actions=True), base_url=LOCAL) as client,
        recording(engine) as sent,
    ):
        for page in PAGES:
            assert client.get(page.format(**ids)).status_code == 200, page
    reading = [(s, p) for s, p in sent if reads_jobs(s)]
    assert len(reading) > len(PAGES)
    scans = []
    with engine.connect() as conn:
        for statement, parameters in reading:
            plan = conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {statement}", parameters).scalar()
            top = plan[0]["Plan"]
            if any(
                n["Node Type"] == "Seq Scan" and n.get("Relation Name") == JOBS for n in nodes(top)
            ):
                scans.append(f"{statement}\n{parameters}\n{json.dumps(top, indent=1)}")
    assert not scans, "\n\n".join(scans)
