"""Error callbacks against a real PostgreSQL: each path to dead enqueues one callback job.

The callback is inserted by ``sa_jobqueue_settle`` (revision ``sajq_0019``) inside the fenced
statement that moves the job to dead: the tests drive those statements directly (the failure
on the last attempt, the bury, the claim that ends a lost last attempt) and assert the rows.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import select, update

from sa_jobqueue import InvalidJobError, JobQueue
from sa_jobqueue._sql.claiming import claim
from sa_jobqueue._sql.transitions import bury, complete, fail
from sa_jobqueue.errors import InvalidWorkflowError, UnknownTaskError
from sa_jobqueue.models import jobs_table
from sa_jobqueue.tasks import Task
from sa_jobqueue.workflows import Call, Dag

j = jobs_table.c
ERROR = json.dumps({"type": "ValueError", "message": "boom"})


@pytest.fixture
def callbacks() -> tuple[JobQueue, Task, Task]:
    """A queue with a callback task and a task that names it."""
    queue = JobQueue()

    @queue.task(queue="alerts", priority=-3, max_attempts=2)
    def report(ctx: Any, payload: Any) -> None: ...

    @queue.task(max_attempts=2, on_error=report)
    def charge(ctx: Any, payload: Any) -> None: ...

    return queue, charge, report


def _claim(conn: sa.Connection, queue: str = "default") -> list[Any]:
    return list(conn.execute(claim(), {"from_queue": queue, "limit": 10, "worker": "w"}))


def _callbacks(conn: sa.Connection, task: str = "report") -> list[Any]:
    return list(
        conn.execute(
            select(j.id, j.queue, j.priority, j.max_attempts, j.payload, j.status)
            .where(j.task == task)
            .order_by(j.id)
        )
    )


def _fail(conn: sa.Connection, job_id: int, attempt: int) -> list[Any]:
    params = {"job_id": job_id, "attempt": attempt, "error": ERROR, "delay": 0}
    return list(conn.execute(fail(), params))


def test_a_failure_on_the_last_attempt_enqueues_one_callback(
    conn: sa.Connection, callbacks: tuple[JobQueue, Task, Task]
) -> None:
    queue, charge, _ = callbacks
    job_id = queue.enqueue(conn, charge, {"amount": 3})
    _claim(conn)
    assert [r.status for r in _fail(conn, job_id, 1)] == ["queued"]
    assert _callbacks(conn) == []  # a retry is no death
    _claim(conn)
    assert [r.status for r in _fail(conn, job_id, 2)] == ["dead"]
    (made,) = _callbacks(conn)
    assert (made.queue, made.priority, made.max_attempts, made.status) == (
        "alerts",
        -3,
        2,
        "queued",
    )
    assert made.payload == {
        "job_id": job_id,
        "task": "charge",
        "error": {"type": "ValueError", "message": "boom"},
        "attempts": 2,
        "workflow_id": None,
    }
    # The callback job carries no callback of its own.
    assert conn.execute(select(j.on_error).where(j.id == made.id)).scalar_one() is None


def test_a_stale_attempts_failure_enqueues_nothing(
    conn: sa.Connection, callbacks: tuple[JobQueue, Task, Task]
) -> None:
    queue, charge, _ = callbacks
    job_id = queue.enqueue(conn, charge, {})
    _claim(conn)
    _fail(conn, job_id, 1)
    _claim(conn)
    assert _fail(conn, job_id, 1) == []  # attempt 1 is stale: the fence matches no row
    assert _callbacks(conn) == []
    _fail(conn, job_id, 2)
    assert len(_callbacks(conn)) == 1
    assert _fail(conn, job_id, 2) == []  # the same death written twice: once
    assert len(_callbacks(conn)) == 1


def test_a_bury_enqueues_one_callback(
    conn: sa.Connection, callbacks: tuple[JobQueue, Task, Task]
) -> None:
    queue, charge, _ = callbacks
    job_id = queue.enqueue(conn, charge, {})
    _claim(conn)
    params = {"job_id": job_id, "attempt": 1, "error": ERROR}
    assert [r.status for r in conn.execute(bury(), params)] == ["dead"]
    assert [c.payload["job_id"] for c in _callbacks(conn)] == [job_id]


def test_a_lost_last_attempt_ended_by_the_claim_enqueues_one_callback(
    conn: sa.Connection, callbacks: tuple[JobQueue, Task, Task]
) -> None:
    queue, charge, _ = callbacks
    job_id = queue.enqueue(conn, charge, {}, max_attempts=1)
    _claim(conn)
    # The worker is lost: its lease runs out.
    conn.execute(update(jobs_table).where(j.id == job_id).values(visible_at=sa.func.now()))
    assert [(r.id, r.status) for r in _claim(conn)] == [(job_id, "dead")]
    (made,) = _callbacks(conn)
    assert made.payload["error"]["type"] == "LeaseExpired"
    assert _claim(conn) == []  # claimed again: nothing more
    assert len(_callbacks(conn)) == 1


def test_success_and_cancellation_enqueue_nothing(
    conn: sa.Connection, callbacks: tuple[JobQueue, Task, Task]
) -> None:
    queue, charge, _ = callbacks
    done = queue.enqueue(conn, charge, {})
    gone = queue.enqueue(conn, charge, {})
    queue.cancel(conn, gone)
    _claim(conn)
    conn.execute(complete(), {"job_id": done, "attempt": 1})
    assert _callbacks(conn) == []


def test_each_death_of_a_requeued_job_enqueues_its_own_callback(
    conn: sa.Connection, callbacks: tuple[JobQueue, Task, Task]
) -> None:
    queue, charge, _ = callbacks
    job_id = queue.enqueue(conn, charge, {}, max_attempts=1)
    _claim(conn)
    _fail(conn, job_id, 1)
    assert queue.requeue(conn, job_id)
    _claim(conn)
    _fail(conn, job_id, 2)
    assert [c.payload["attempts"] for c in _callbacks(conn)] == [1, 2]


def test_the_enqueue_option_names_the_callback_by_name_or_call(
    conn: sa.Connection, callbacks: tuple[JobQueue, Task, Task]
) -> None:
    queue, _, report = callbacks

    @queue.task(max_attempts=1)
    def plain(ctx: Any, payload: Any) -> None: ...

    by_name = queue.enqueue(conn, plain, {}, on_error="report")
    by_call = queue.enqueue(
        conn, plain, {}, on_error=Call(report, {"team": "billing"}, {"queue": "urgent"})
    )
    untouched = queue.enqueue(conn, plain, {})
    _claim(conn)
    for job_id in (by_name, by_call, untouched):
        _fail(conn, job_id, 1)
    made = _callbacks(conn)
    assert [(c.queue, c.payload["job_id"]) for c in made] == [
        ("alerts", by_name),
        ("urgent", by_call),
    ]
    assert made[1].payload["team"] == "billing"


def test_enqueue_many_and_copy_carry_the_callback(
    conn: sa.Connection, callbacks: tuple[JobQueue, Task, Task]
) -> None:
    queue, charge, _ = callbacks
    ids = queue.enqueue_many(conn, charge, [{}] * 3, max_attempts=1)
    rows = conn.execute(select(j.on_error).where(j.id.in_(ids))).scalars().all()
    assert [row["job"]["task"] for row in rows] == ["report"] * 3


def test_a_bad_callback_is_refused_before_any_sql(
    conn: sa.Connection, callbacks: tuple[JobQueue, Task, Task]
) -> None:
    queue, charge, report = callbacks
    with pytest.raises(InvalidJobError):
        queue.enqueue(conn, charge, {}, on_error=42)  # type: ignore[arg-type]
    with pytest.raises(InvalidJobError):
        queue.enqueue(conn, charge, {}, on_error=Call(report, [1, 2]))


def test_a_dependency_rechecked_at_commit_enqueues_no_second_callback(
    conn: sa.Connection, callbacks: tuple[JobQueue, Task, Task]
) -> None:
    queue, charge, _ = callbacks
    job_id = queue.enqueue(conn, charge, {}, max_attempts=1)
    _claim(conn)
    # Enqueued while the job runs: the edge is looked at again at the commit, by a deferred
    # trigger that settles a dependency found ended (dead, here) a second time.
    waiting = queue.enqueue(conn, charge, {}, depends_on=[job_id])
    _fail(conn, job_id, 1)
    conn.execute(sa.text("SET CONSTRAINTS ALL IMMEDIATE"))  # the commit's checks, now
    status = conn.execute(select(j.status).where(j.id == waiting)).scalar_one()
    assert status == "cancelled"
    assert len(_callbacks(conn)) == 1


def test_lease_is_kept_in_seconds(
    conn: sa.Connection, callbacks: tuple[JobQueue, Task, Task]
) -> None:
    queue, _, report = callbacks

    @queue.task(max_attempts=1)
    def plain(ctx: Any, payload: Any) -> None: ...

    job_id = queue.enqueue(
        conn, plain, {}, on_error=Call(report, None, {"lease": timedelta(minutes=2)})
    )
    _claim(conn)
    _fail(conn, job_id, 1)
    lease = conn.execute(select(j.lease).where(j.task == "report")).scalar_one()
    assert lease == timedelta(minutes=2)


@pytest.fixture
def flows() -> JobQueue:
    """A queue whose steps die at their first failure, and a callback task."""
    queue = JobQueue()

    @queue.task(queue="alerts")
    def report(ctx: Any, payload: Any) -> None: ...

    @queue.task(max_attempts=1)
    def step(ctx: Any, payload: Any) -> None: ...

    return queue


def test_a_workflows_callback_is_enqueued_once_at_its_first_death(
    conn: sa.Connection, flows: JobQueue
) -> None:
    flow = flows.group(conn, [Call("step", {"n": n}) for n in range(3)], on_error="report")
    _claim(conn)
    _fail(conn, flow[1], 1)
    (made,) = _callbacks(conn)
    row = conn.execute(select(j.workflow_id, j.workflow_step, j.queue).where(j.id == made.id)).one()
    assert tuple(row) == (flow.id, "on_error", "alerts")
    assert (made.payload["job_id"], made.payload["workflow_id"]) == (flow[1], flow.id)
    _fail(conn, flow[2], 1)  # a second death of the same workflow: no second callback
    assert [c.id for c in _callbacks(conn)] == [made.id]
    assert [r.status for r in _fail(conn, flow[0], 1)] == ["dead"]
    assert len(_callbacks(conn)) == 1


def test_a_chains_callback_fires_for_its_death_not_for_what_it_cancels(
    conn: sa.Connection, flows: JobQueue
) -> None:
    flow = flows.chain(
        conn, [Call("step"), Call("step"), Call("step")], on_error=Call("report", {"why": "chain"})
    )
    _claim(conn)
    _fail(conn, flow[0], 1)
    statuses = dict(conn.execute(select(j.id, j.status).where(j.id.in_(list(flow)))).all())
    assert [statuses[i] for i in flow] == ["dead", "cancelled", "cancelled"]
    (made,) = _callbacks(conn)
    assert made.payload["why"] == "chain"
    assert made.payload["job_id"] == flow[0]


def test_a_dags_callback_and_the_name_it_reserves(conn: sa.Connection, flows: JobQueue) -> None:
    with pytest.raises(InvalidWorkflowError, match="on_error"):
        Dag().add("on_error", Call("step"))
    with pytest.raises(UnknownTaskError):
        flows.workflow(conn, Dag().add("a", Call("step")), on_error="no_such_task")
    assert conn.execute(select(sa.func.count()).select_from(jobs_table)).scalar_one() == 0
    flow = flows.workflow(
        conn, Dag().add("a", Call("step")).add("b", Call("step")), on_error="report"
    )
    _claim(conn)
    _fail(conn, flow.steps["b"], 1)
    (made,) = _callbacks(conn)
    assert made.payload["job_id"] == flow.steps["b"]
