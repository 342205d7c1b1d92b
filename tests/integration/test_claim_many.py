"""The claim over many queues (``claim_many``): turns between queues, and what it leaves out.

Each test runs in a transaction that is rolled back. A real worker draining thousands of
queues is in tests/acceptance/test_many_queues.py.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa

from sa_jobqueue._sql.claim_many import claim_many
from sa_jobqueue.ops import pause_queue, set_queue_concurrency, set_queue_rate
from sa_jobqueue.worker._served import NEAR_LEAST, Served
from tests.helpers.job_states import add_job
from tests.helpers.jobs import row


def claim_params(served: list[str], limit: int, after: str = "", **more: Any) -> dict[str, Any]:
    return {
        **Served(served).params(after, limit),
        "after_queue": after,
        "limit": limit,
        "worker": "many-test",
        **more,
    }


def claim(
    conn: sa.Connection, served: list[str], limit: int, after: str = "", **more: Any
) -> list[sa.Row[Any]]:
    return list(conn.execute(claim_many(), claim_params(served, limit, after, **more)))


def add_queued(conn: sa.Connection, queues: list[str]) -> None:
    """One queued job in each of ``queues`` (one INSERT)."""
    conn.execute(
        sa.text(
            "INSERT INTO sa_jobqueue_jobs (queue, task, payload)"
            " SELECT name, 'work', 'null' FROM unnest(CAST(:names AS text[])) AS name"
        ),
        {"names": queues},
    )


def plan_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)


def queues_of(rows: list[sa.Row[Any]]) -> Counter[str]:
    return Counter(r.queue for r in rows)


def test_a_busy_queue_does_not_starve_a_quiet_one(conn: sa.Connection) -> None:
    for _ in range(50):
        add_job(conn, queue="busy")
    quiet = add_job(conn, queue="quiet")
    rows = claim(conn, ["busy", "quiet"], 2)
    assert queues_of(rows) == {"busy": 1, "quiet": 1}
    assert quiet in {r.id for r in rows}
    assert {r.ready_queues for r in rows} == {2}


def test_the_slots_are_shared_evenly_and_each_queue_goes_in_claim_order(
    conn: sa.Connection,
) -> None:
    firsts = {}
    for queue in ("a", "b", "c"):
        for n in range(10):
            job = add_job(conn, queue=queue)
            if n == 0:
                firsts[queue] = job
    urgent = add_job(conn, queue="b")
    conn.execute(sa.text("UPDATE sa_jobqueue_jobs SET priority = -1 WHERE id = :i"), {"i": urgent})
    rows = claim(conn, ["*"], 6)
    assert queues_of(rows) == {"a": 2, "b": 2, "c": 2}
    ids = {r.id for r in rows}
    assert firsts["a"] in ids
    assert firsts["c"] in ids
    assert urgent in ids  # within its queue, priority first


def test_with_more_queues_than_slots_each_claim_takes_its_turn_past_the_last(
    conn: sa.Connection,
) -> None:
    names = [f"t-{n:02d}" for n in range(10)]
    for name in names:
        add_job(conn, queue=name)
    first = claim(conn, ["t-*"], 3)
    assert sorted(queues_of(first)) == names[:3]
    assert {r.last_queue for r in first} == {"t-02"}
    second = claim(conn, ["t-*"], 3, after="t-02")
    assert sorted(queues_of(second)) == names[3:6]
    # Past the end the walk finds fewer queues than slots: the caller starts from the first.
    tail = claim(conn, ["t-*"], 8, after="t-05")
    assert sorted(queues_of(tail)) == names[6:]
    assert {r.ready_queues for r in tail} == {4}


def test_only_the_served_queues_are_claimed_by_name_or_pattern(conn: sa.Connection) -> None:
    add_job(conn, queue="tenant-1")
    add_job(conn, queue="tenant-2")
    add_job(conn, queue="tenantx9")  # not matched by tenant_? (LIKE's _ is escaped)
    add_job(conn, queue="tenant_9")
    add_job(conn, queue="other")
    add_job(conn, queue="named")
    rows = claim(conn, ["tenant-*", "tenant_?", "named"], 10)
    assert set(queues_of(rows)) == {"tenant-1", "tenant-2", "tenant_9", "named"}


def test_paused_and_limited_queues_are_left_to_their_own_claims(conn: sa.Connection) -> None:
    for queue in ("paused", "capped", "rated", "free"):
        add_job(conn, queue=queue)
    pause_queue(conn, "paused")
    set_queue_concurrency(conn, "capped", 5)
    set_queue_rate(conn, "rated", "10/s")
    rows = claim(conn, ["*"], 10)
    assert set(queues_of(rows)) == {"free"}


def test_expired_leases_are_reclaimed_and_jobs_not_due_are_left(conn: sa.Connection) -> None:
    lost = add_job(conn, queue="a", status="running", attempts=1, started_ago=60, visible_in=-30)
    later = add_job(conn, queue="b", visible_in=3600)
    held = add_job(conn, queue="c", status="running", attempts=1, started_ago=1, visible_in=30)
    rows = claim(conn, ["*"], 10)
    assert [r.id for r in rows] == [lost]
    assert row(conn, lost).attempts == 2
    assert row(conn, later).status == "queued"
    assert row(conn, held).attempts == 1


def test_nothing_due_claims_nothing(conn: sa.Connection) -> None:
    add_job(conn, queue="a", visible_in=60)
    assert claim(conn, ["*"], 10) == []


def test_a_drain_of_listed_queues_does_not_read_the_whole_list_at_each_claim(
    conn: sa.Connection,
) -> None:
    # What the claim did, as EXPLAIN ANALYZE counts it: the whole list, split into a row per
    # name (the plan's one ProjectSet, unnest) and hashed, used to come with every claim.
    names = [f"tenant-{n:04d}" for n in range(2000)]
    add_queued(conn, names)
    statement = claim_many().compile(dialect=conn.dialect)
    params = statement.construct_params(claim_params(names, 10, after="tenant-0499"))
    explain = "EXPLAIN (ANALYZE, FORMAT JSON) " + statement.string
    plan = conn.exec_driver_sql(explain, params).scalar_one()[0]["Plan"]
    split = [n for n in plan_nodes(plan) if n["Node Type"] == "ProjectSet"]
    assert len(split) == 1
    assert split[0]["Actual Loops"] == 0  # never executed
    claimed = conn.execute(sa.text("SELECT queue FROM sa_jobqueue_jobs WHERE status = 'running'"))
    assert sorted(claimed.scalars()) == names[500:510]


def test_listed_queues_are_served_exactly_whatever_near_holds(conn: sa.Connection) -> None:
    # ``:near`` is a hint cut from the list; a claim serves the listed queues, and only them,
    # whether it holds the names the walk reaches, none of them, or names out of order.
    listed = ["a", "b", "c", "d"]
    add_queued(conn, [*listed, "a,b", "b0", "e"])
    for near in (",", ",d,c,b,a,", ",c,", ",a,b,"):
        with conn.begin_nested() as attempt:
            rows = claim(conn, listed, 10, near=near)
            assert sorted(queues_of(rows)) == listed, near
            attempt.rollback()
    # A queue written with a comma in its name (by hand: names have none) is not two listed
    # ones side by side.
    rows = claim(conn, ["a", "b", "x-*"], 10, near=",a,b,")
    assert sorted(queues_of(rows)) == ["a", "b"]


def test_a_long_list_is_served_past_near_and_from_each_turn(conn: sa.Connection) -> None:
    # Listed queues with no due job between those that have one: the walk reaches past
    # ``:near`` (the first NEAR_LEAST names, for so few slots) and finds the rest in the
    # whole list.
    gap = NEAR_LEAST + 1
    names = [f"q-{n:04d}" for n in range(10 * gap)]
    due = names[::gap]
    add_queued(conn, due)
    first = claim(conn, names, 4)
    assert sorted(queues_of(first)) == due[:4]
    rest = claim(conn, names, 10, after=first[0].last_queue)
    assert sorted(queues_of(rest)) == due[4:]
