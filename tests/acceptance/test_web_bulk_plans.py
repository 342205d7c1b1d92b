"""Every statement "act on many" sends reads a bounded part of the jobs table, through an index.

The history of ``test_web_plans`` (40,000 finished jobs and a backlog of 2,000, analysed); each
action is asked for all of a filter (the confirmation's count) and confirmed (one batch), and
by chosen ids, over HTTP, recording what the app sends. Each recorded statement is then run
again under ``EXPLAIN (ANALYZE, FORMAT JSON)`` in a transaction rolled back (they write): none
may scan the jobs table from end to end, and none may look at more of its rows than a few
batches' worth, however the planner chose to read them.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import sqlalchemy as sa
from starlette.testclient import TestClient

from sa_jobqueue.ops import bulk
from sa_jobqueue.ops.bulk import BULK_BATCH
from sa_jobqueue.web import _bulk, create_app
from sa_jobqueue.web._tokens import CSRF_FIELD
from tests.acceptance.test_web_plans import examined, nodes, on_jobs
from tests.helpers.dashboard_history import fill, reads_jobs, recording
from tests.helpers.pages import LOCAL, post_form

HISTORY = 40_000
BACKLOG = 2_000
#: The confirmation counts this far (10,000 on a real history: a quarter of this one).
COUNTED = 2_000
#: Ids a delete or a count of succeeded and cancelled jobs looks through per statement:
#: 20,000 is a fiftieth of a million; a twentieth of this history (a window over half the
#: table would rightly be read end to end).
WINDOW = 2_000
#: A batch reads its index in order and stops at the batch; a filter on a column the index
#: lacks (the queue, on the prune index) throws away the other queues' rows on the way: with
#: a third of the jobs in each queue, three times the batch. A full read is 42,000.
MOST_EXAMINED = 3 * max(BULK_BATCH, COUNTED) + 1_000

#: (action, list filter) for "all matching".
BY_FILTER: list[tuple[str, dict[str, Any]]] = [
    ("cancel", {"queue": "emails"}),
    ("run_now", {"queue": "reports"}),
    ("retry", {"status": "dead", "queue": "reports"}),
    ("delete", {"status": "succeeded", "queue": "emails"}),
    ("delete", {"status": ["dead", "cancelled"]}),
    ("delete", {}),
]


def test_every_bulk_statement_reads_a_bounded_part_of_the_jobs_table(
    engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_bulk, "COUNTED", COUNTED)
    monkeypatch.setattr(bulk, "BULK_WINDOW", WINDOW)
    fill(engine, HISTORY, BACKLOG, spacing=5.0)
    with TestClient(create_app(engine, allow_actions=True), base_url=LOCAL) as client:
        form = post_form(client.get("/jobs", params={"queue": "emails"}).text, "/jobs/bulk")
        token = {CSRF_FIELD: form.fields[CSRF_FIELD]}
        ids = form.fields["page_id"]
        with recording(engine) as sent:
            for action, query in BY_FILTER:
                fields = {**token, **query, "action": action, "scope": "all"}
                asked = client.post("/jobs/bulk", data=fields)
                assert asked.status_code == 200, asked.text
                done = client.post("/jobs/bulk", data={**fields, "confirmed": "yes"})
                assert done.status_code == 200, done.text
                assert "nothing changed" not in done.text
            for action in ("cancel", "run_now", "retry", "delete"):
                fields = {**token, "action": action, "id": ids, "confirmed": "yes"}
                assert client.post("/jobs/bulk", data=fields).status_code == 200
    reading = [(s, p) for s, p in sent if reads_jobs(s)]
    assert len(reading) >= 2 * len(BY_FILTER)
    faults = []
    with engine.connect() as conn:
        conn.exec_driver_sql("SET max_parallel_workers_per_gather = 0")
        conn.commit()  # the setting stays for the session; each statement is rolled back
        for statement, parameters in reading:
            with conn.begin() as transaction:
                explain = f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}"
                top = conn.exec_driver_sql(explain, parameters).scalar()[0]["Plan"]
                transaction.rollback()
            reads = [n for n in nodes(top) if on_jobs(n)]
            looked = sum(examined(n) for n in reads)
            scans = [n for n in reads if n["Node Type"] == "Seq Scan"]
            if scans or not reads or looked > MOST_EXAMINED:
                faults.append(
                    f"{looked} rows looked at, {len(scans)} sequential scan(s):\n{statement}"
                    f"\n{parameters}\n{json.dumps(top, indent=1)}"
                )
    assert not faults, "\n\n".join(faults)
