"""Queue depth (ops.queue_depth, JobQueue.depth, ops.depth_query): what it counts, and that it
reads the claim index only, however much finished history the table holds."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from sa_jobqueue import JobQueue
from sa_jobqueue.errors import InvalidNameError
from sa_jobqueue.ops import depth_query, queue_depth
from tests.integration.test_statement_costs import _buffers, _explain, _nodes

ROWS = sa.text(
    "INSERT INTO sa_jobqueue_jobs (queue, task, payload, status, attempts, visible_at,"
    " finished_at)"
    " SELECT :queue, 'noop', '{}', :status, CASE WHEN :status = 'queued' THEN 0 ELSE 1 END,"
    "  now() + make_interval(secs => :offset),"
    "  CASE WHEN :status IN ('succeeded', 'dead', 'cancelled') THEN now() END"
    " FROM generate_series(1, :n)"
)


def _rows(conn: sa.Connection, queue: str, status: str, n: int, offset: float = -1.0) -> None:
    """``n`` jobs of ``queue`` in ``status``, visible ``offset`` seconds from now."""
    conn.execute(ROWS, {"queue": queue, "status": status, "n": n, "offset": offset})


def test_depth_counts_what_a_claim_could_take_now(conn: sa.Connection) -> None:
    _rows(conn, "depth-a", "queued", 3)  # due
    _rows(conn, "depth-a", "running", 2)  # leases expired: a claim takes them back
    _rows(conn, "depth-a", "queued", 4, offset=3600)  # scheduled for later
    _rows(conn, "depth-a", "running", 5, offset=30)  # live leases
    _rows(conn, "depth-a", "waiting", 6)  # waiting for dependencies
    _rows(conn, "depth-a", "succeeded", 7)
    _rows(conn, "depth-a", "dead", 8)
    _rows(conn, "depth-b", "queued", 1)
    _rows(conn, "depth-c", "queued", 1, offset=3600)

    everything = queue_depth(conn)
    assert {q: n for q, n in everything.items() if q.startswith("depth-")} == {
        "depth-a": 5,
        "depth-b": 1,
    }
    assert queue_depth(conn, ["depth-b", "depth-c", "depth-a"]) == {
        "depth-b": 1,
        "depth-c": 0,
        "depth-a": 5,
    }
    assert JobQueue().depth(conn, ["depth-a"]) == {"depth-a": 5}
    # The autoscaler's text is the same count, summed over the queues it names.
    total = conn.exec_driver_sql(depth_query(["depth-a", "depth-b", "depth-c"])).scalar_one()
    assert total == 6


def test_depth_reads_through_an_engine_and_refuses_bad_names(
    integration_engine: sa.Engine,
) -> None:
    assert queue_depth(integration_engine, ["depth-nothing"]) == {"depth-nothing": 0}
    with pytest.raises(InvalidNameError):
        queue_depth(integration_engine, ["no spaces"])
    with pytest.raises(InvalidNameError):
        depth_query(["x'); DROP TABLE sa_jobqueue_jobs; --"])


def _plan(conn: sa.Connection) -> Any:
    statement = sa.text(depth_query(["depth-cost"]))
    return _explain(conn, statement, {})


def test_depth_reads_the_claim_index_not_the_history(conn: sa.Connection) -> None:
    """The count is over the claim index (the backlog): finished rows cost it nothing."""
    _rows(conn, "depth-cost", "queued", 2_000)
    _rows(conn, "depth-cost", "succeeded", 30_000)
    conn.exec_driver_sql("ANALYZE sa_jobqueue_jobs")
    plan = _plan(conn)
    # An index-only scan once vacuumed; a bitmap of the index here, in one transaction.
    nodes = list(_nodes(plan["Plan"]))
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], nodes
    assert {n["Index Name"] for n in nodes if "Index Name" in n} == {"sa_jobqueue_jobs_claim_idx"}
    assert plan["Plan"]["Actual Rows"] == 1
    # The backlog's index pages (and, in this transaction, before a vacuum marks them all
    # visible, the backlog's heap pages); the 30,000 finished rows take some 600 pages.
    assert _buffers(plan) < 200, _buffers(plan)


def test_the_keda_recipe_sends_the_statement_depth_query_builds() -> None:
    """The query in the deployment recipe is ``depth_query``'s text for its queues, word for
    word: a change to the statement fails here until the recipe is regenerated."""
    page = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "deploy-workers.md"
    found = re.findall(r'^ +query: "(.*)"$', page.read_text(), flags=re.MULTILINE)
    assert found == [depth_query(["default", "emails"])]
