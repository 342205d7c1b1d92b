"""Batch tasks in the test's rolled-back transaction: the claim that fills a batch, and
``testing.run_task`` on a batch task.

The claim is ``claim_limits.claim_limited(batch=True)``, run as the worker's ``Batches._fill``
runs it: one task's due jobs (one batch key's), under the queue's rules.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from sa_jobqueue import BatchContext, BatchJob, JobQueue
from sa_jobqueue._sql import claim_limits, claiming
from sa_jobqueue.ops import pause_queue, resume_queue, set_queue_concurrency
from sa_jobqueue.testing import run_task

queue = JobQueue(default_queue="batches")


@queue.batch_task(max_size=10, batch_key="tenant")
def per_tenant(ctx: BatchContext, jobs: list[BatchJob[dict[str, Any]]]) -> None: ...


@queue.task
def single(ctx: object, payload: dict[str, Any]) -> None: ...


def lead(conn: sa.Connection) -> int:
    """Claim the queue's first job, as the worker's claim loop would: the batch's leader."""
    params = {"from_queue": "batches", "limit": 1, "worker": "w"}
    (leader,) = [r.id for r in conn.execute(claiming.claim(), params)]
    return leader


def fill(conn: sa.Connection, leader: int, limit: int = 10, keyed: bool = False) -> list[int]:
    params = {
        "from_queue": "batches",
        "limit": limit,
        "worker": "w",
        "batch_task": "per_tenant",
        "batch_key_field": "tenant",
        "batch_leader": leader,
    }
    rows = conn.execute(claim_limits.claim_limited(keyed=keyed, batch=True), params).all()
    return [r.id for r in rows if r.id is not None]


def test_only_the_leaders_task_and_key_in_claim_order(conn: sa.Connection) -> None:
    payloads = [{"tenant": t} for t in ["a", "b", "a", "a", "b"]] + [{"tenant": 1}, {}]
    ids = [int(i) for i in queue.enqueue_many(conn, per_tenant, payloads)]
    queue.enqueue(conn, single, {"tenant": "a"})
    queue.enqueue(conn, per_tenant, {"tenant": "a"}, run_at=timedelta(hours=1))
    leader = lead(conn)
    assert leader == ids[0]
    assert fill(conn, leader) == [ids[2], ids[3]]  # not b's, not another task's, not the later
    assert fill(conn, leader) == []  # claimed already


def test_jobs_without_the_field_go_with_a_leader_without_it(conn: sa.Connection) -> None:
    ids = [int(i) for i in queue.enqueue_many(conn, per_tenant, [{}, {"tenant": "a"}, {}])]
    assert fill(conn, lead(conn)) == [ids[2]]


def test_a_paused_queue_gives_none_and_a_cap_counts_each_member(conn: sa.Connection) -> None:
    ids = [int(i) for i in queue.enqueue_many(conn, per_tenant, [{"tenant": "a"}] * 6)]
    leader = lead(conn)
    pause_queue(conn, "batches")
    assert fill(conn, leader) == []
    set_queue_concurrency(conn, "batches", 3)
    resume_queue(conn, "batches")
    # A cap of 3: two more beside the leader (the recount of a new cap counts it).
    assert fill(conn, leader) == ids[1:3]
    assert fill(conn, leader) == []


@queue.batch_task(keep_result=True)
def echo(ctx: BatchContext, jobs: list[BatchJob[dict[str, Any]]]) -> list[int]:
    ctx.session.execute(sa.text("SELECT 1"))
    return [job.id * 10 + job.payload["n"] for job in jobs]


def test_run_task_hands_a_batch_task_its_payloads_as_one_batch(session: Session) -> None:
    assert run_task(echo, [{"n": 1}, {"n": 2}], session=session, job_id=7) == [71, 82]
