"""The hot path's statements cost the same however many jobs were claimed or finished before.

Measured in what PostgreSQL did, not in time: the buffers a statement touched and the rows
its plan's nodes produced (EXPLAIN (ANALYZE, BUFFERS)), which a busy machine does not change.
Each test runs the statement over a small and a large past, in one rolled-back transaction,
and compares.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from sa_jobqueue._sql import claiming, leases, transitions
from sa_jobqueue.models import jobs_table

j = jobs_table.c
QUEUE = "costs"


def _explain(conn: sa.Connection, statement: sa.Executable, params: dict[str, Any]) -> Any:
    """The JSON plan of ``statement`` run once with ``params`` (its effects stay)."""
    compiled = statement.compile(dialect=conn.dialect)
    text = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + compiled.string
    return conn.exec_driver_sql(text, compiled.construct_params(params)).scalar_one()[0]


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from _nodes(child)


def _buffers(plan: dict[str, Any]) -> int:
    top = plan["Plan"]
    return int(top["Shared Hit Blocks"]) + int(top["Shared Read Blocks"])


def _rows_produced(plan: dict[str, Any]) -> int:
    """Rows all the plan's nodes produced together, every execution of each counted."""
    return sum(int(n["Actual Rows"]) * int(n["Actual Loops"]) for n in _nodes(plan["Plan"]))


INSERT = sa.text(
    "INSERT INTO sa_jobqueue_jobs (queue, task, payload, status, attempts, finished_at)"
    " SELECT :queue, 'noop', '{}', :status, :attempts,"
    "  CASE WHEN :status = 'queued' THEN NULL ELSE now() END"
    " FROM generate_series(1, :n)"
)


def _enqueue(conn: sa.Connection, n: int, status: str = "queued") -> None:
    """``n`` rows in ``QUEUE``: queued, or finished (``succeeded``) a moment ago."""
    attempts = 0 if status == "queued" else 1
    conn.execute(INSERT, {"queue": QUEUE, "status": status, "attempts": attempts, "n": n})


def _claim(conn: sa.Connection, limit: int) -> list[Any]:
    params = {"from_queue": QUEUE, "limit": limit, "worker": "w"}
    return list(conn.execute(claiming.claim(), params).all())


BATCHED = {
    "complete_many": transitions.complete_many,
    "release": transitions.release,
    "extend_leases": leases.extend_leases,
    "still_held": leases.still_held,
}


@pytest.mark.parametrize("history", [0, 100_000])
@pytest.mark.parametrize("statement", sorted(BATCHED))
def test_a_batched_transition_reads_each_attempt_once_over_finished_history(
    conn: sa.Connection, statement: str, history: int
) -> None:
    """Over a table of finished rows, with statistics taken while the backlog was queued (so
    they say nothing runs), the planner once joined a batch to its ``unnest`` by a nested loop
    that read the whole batch again for each row: 500 x 500 rows for a batch of 500."""
    _enqueue(conn, 2_000)
    _enqueue(conn, history, status="succeeded")
    conn.exec_driver_sql("ANALYZE sa_jobqueue_jobs")
    running = [r.id for r in _claim(conn, 500)]
    params: dict[str, Any] = {"job_ids": running, "attempt_list": [1] * len(running)}
    if statement == "extend_leases":
        params["progress"] = "{}"  # sent as the driver's text: no report to write
    plan = _explain(conn, BATCHED[statement](), params)
    assert plan["Plan"]["Actual Rows"] == len(running)
    # A row of the table and one of the batch at each step, a few nodes deep: linear in the
    # batch, and at most one pass over the 2,000 unfinished rows (a table that small may be
    # read whole rather than through an index), never over the history.
    assert _rows_produced(plan) <= 8 * len(running) + 2_000, _rows_produced(plan)


def test_the_claim_commits_without_waiting_for_the_disk_and_only_the_claim(
    conn: sa.Connection, integration_engine: sa.Engine
) -> None:
    """Waiting for its WAL flush was most of an idle worker's pickup latency; a lost claim
    loses nothing (see ``claiming.claim_commits_async``), other transactions must still wait."""
    _enqueue(conn, 1)
    assert len(_claim(conn, 1)) == 1
    # The claim turned the setting off for the transaction it ran in...
    assert conn.exec_driver_sql("SHOW synchronous_commit").scalar_one() == "off"
    # ...and, run as the worker runs it (autocommit: a transaction of its own), for no other.
    with integration_engine.connect() as single:
        single = single.execution_options(isolation_level="AUTOCOMMIT")
        assert _claim(single, 1) == []
        assert single.exec_driver_sql("SHOW synchronous_commit").scalar_one() == "on"


def _claim_and_finish(conn: sa.Connection, n: int) -> tuple[int, Any, int]:
    """Claim ``n`` jobs and mark them succeeded; the claim position past the last one."""
    rows = _claim(conn, n)
    finished = {"status": "succeeded", "finished_at": sa.func.now()}
    conn.execute(sa.update(jobs_table).where(j.id.in_([r.id for r in rows])).values(finished))
    return max((r.priority, r.visible_at, r.id) for r in rows)


def _claim_past(conn: sa.Connection, position: tuple[int, Any, int]) -> Any:
    priority, visible_at, last = position
    params = {"from_queue": QUEUE, "limit": 10, "worker": "w", "after_priority": priority,
              "after_visible_at": visible_at, "after_id": last}  # fmt: skip
    plan = _explain(conn, claiming.claim_after(), params)
    assert plan["Plan"]["Actual Rows"] == 10
    return plan


def test_a_claim_past_its_position_does_not_step_over_what_earlier_claims_left(
    conn: sa.Connection,
) -> None:
    """Each claimed or finished job leaves its queued version's entry at the head of the claim
    index until VACUUM: a claim from the head steps over all of them, one from the position
    the previous claim reached does not."""
    _enqueue(conn, 6_000)
    conn.exec_driver_sql("ANALYZE sa_jobqueue_jobs")
    fresh = _claim_past(conn, _claim_and_finish(conn, 10))
    later = _claim_past(conn, _claim_and_finish(conn, 5_000))
    assert _buffers(later) <= 1.5 * _buffers(fresh), (_buffers(fresh), _buffers(later))
    head = _explain(conn, claiming.claim(), {"from_queue": QUEUE, "limit": 10, "worker": "w"})
    assert head["Plan"]["Actual Rows"] == 10
    assert _buffers(head) > 2 * _buffers(later), (_buffers(head), _buffers(later))
