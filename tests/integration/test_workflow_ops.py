"""Workflows as objects: the id every job of a chain, group, chord or DAG carries, and reading,
cancelling, retrying and deleting one, in the caller's transaction.

Jobs are ended here as a worker's statements end them: the row's status, then the settling
function in the same transaction (see _sql.dependencies), so what waits on them moves as it
would under a worker. The real workers are in tests/acceptance/test_workflow_objects.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import func
from sqlalchemy.orm import Session

from sa_jobqueue import JobContext, JobQueue
from sa_jobqueue.errors import (
    InvalidJobError,
    InvalidWorkflowError,
    UnknownJobError,
    UnknownWorkflowError,
    WorkflowNotFinishedError,
)
from sa_jobqueue.models import dependencies_table, jobs_table
from sa_jobqueue.ops import cancel_workflow, delete_workflow, get_workflow, retry_workflow
from sa_jobqueue.workflows import Call, Dag, Workflow

j = jobs_table.c
e = dependencies_table.c


def make_queue() -> JobQueue:
    queue = JobQueue(default_queue="flows")

    @queue.task
    def step(ctx: JobContext, payload: Any) -> None:
        """Never run here."""

    @queue.task(unique_key=lambda payload: (payload or {}).get("key"))
    def keyed(ctx: JobContext, payload: Any) -> None:
        """Never run here."""

    return queue


@pytest.fixture
def queue() -> JobQueue:
    return make_queue()


def status(conn: sa.Connection, *ids: int) -> list[str]:
    found = dict(conn.execute(sa.select(j.id, j.status).where(j.id.in_(ids))).all())
    return [found.get(i, "gone") for i in ids]


def pending(conn: sa.Connection, job_id: int, depends_on: int) -> bool | None:
    row = conn.execute(
        sa.select(e.pending).where(e.job_id == job_id, e.depends_on == depends_on)
    ).first()
    return None if row is None else bool(row.pending)


def start(conn: sa.Connection, job_id: int) -> None:
    """Claim ``job_id`` as a worker would (its first attempt)."""
    done = conn.execute(
        sa.update(jobs_table)
        .where(j.id == job_id, j.status == "queued")
        .values(status="running", attempts=j.attempts + 1, started_at=func.now(), worker="w")
    )
    assert done.rowcount == 1


def end(conn: sa.Connection, job_id: int, outcome: str) -> None:
    """End running ``job_id`` as the worker's fenced statement does, settling its dependents."""
    if status(conn, job_id) == ["queued"]:
        start(conn, job_id)
    done = conn.execute(
        sa.update(jobs_table)
        .where(j.id == job_id, j.status == "running")
        .values(status=outcome, finished_at=func.now(), worker=None)
    )
    assert done.rowcount == 1
    conn.execute(sa.select(func.sa_jobqueue_settle([job_id], [outcome])))


def test_every_job_of_a_chain_group_chord_and_dag_carries_its_workflows_id(
    queue: JobQueue, session: Session, conn: sa.Connection
) -> None:
    chain = queue.chain(session, [Call("step"), Call("step"), Call("step")])
    group = queue.group(session, [Call("step", {"n": n}) for n in range(3)])
    chord = queue.chord(session, [Call("step"), Call("step")], Call("step"))
    dag = queue.workflow(session, Dag().add("a", Call("step")).add("b", Call("step"), needs=["a"]))
    alone = queue.enqueue(session, "step")
    flows = [chain, group, chord, dag]
    assert len({flow.id for flow in flows}) == 4
    for flow in flows:
        rows = conn.execute(sa.select(j.id).where(j.workflow_id == flow.id).order_by(j.id))
        assert rows.scalars().all() == list(flow)
    assert conn.execute(sa.select(j.workflow_id).where(j.id == alone)).scalar_one() is None
    _first, _second, _third = chain  # a Workflow unpacks as the list of ids did
    *members, callback = chord
    assert pending(conn, callback, members[0]) is True
    assert dag.steps == {"a": dag[0], "b": dag[1]}
    assert pending(conn, dag.steps["b"], dag.steps["a"]) is True
    names = conn.execute(sa.select(j.workflow_step).where(j.workflow_id == dag.id).order_by(j.id))
    assert names.scalars().all() == ["a", "b"]


def test_a_group_of_copy_size_carries_the_workflow_id(
    queue: JobQueue, session: Session, conn: sa.Connection
) -> None:
    group = queue.group(session, [Call("step", {"n": n}) for n in range(250)])  # by COPY
    counted = conn.execute(sa.select(func.count()).where(j.workflow_id == group.id)).scalar_one()
    assert counted == 250 == len(group)


def test_a_dag_runs_each_step_after_the_steps_it_needs(
    queue: JobQueue, session: Session, conn: sa.Connection
) -> None:
    dag = Dag()
    dag.add("publish", Call("step"), needs=["thumbnail", "index"])  # named before they are
    dag.add("fetch", Call("step"))
    dag.add("thumbnail", Call("step"), needs=["fetch"])
    dag.add("index", Call("step"), needs=["fetch"], on_failure="run")
    flow = queue.workflow(session, dag)
    s = flow.steps
    assert status(conn, s["fetch"], s["thumbnail"], s["index"], s["publish"]) == [
        "queued",
        "waiting",
        "waiting",
        "waiting",
    ]
    end(conn, s["fetch"], "dead")
    # thumbnail is cancelled by its failed need; index runs anyway; publish follows thumbnail.
    assert status(conn, s["thumbnail"], s["index"], s["publish"]) == [
        "cancelled",
        "queued",
        "cancelled",
    ]
    info = flow.read(session)
    assert info.state == "active"
    assert info.steps["index"].status == "queued"
    assert {(x.job_id, x.depends_on) for x in info.edges} == {
        (s["thumbnail"], s["fetch"]),
        (s["index"], s["fetch"]),
        (s["publish"], s["thumbnail"]),
        (s["publish"], s["index"]),
    }


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Dag().add("a", Call("step")).add("a", Call("step")), "two steps are named 'a'"),
        (lambda: Dag().add("a", Call("step"), needs=["a"]), "needs itself"),
        (lambda: Dag().add("", Call("step")), "1 to 200 characters"),
        (lambda: Dag().add("a", "step"), "runs a Call"),  # type: ignore[arg-type]
    ],
)
def test_a_bad_step_is_refused_as_it_is_added(build: Any, message: str) -> None:
    with pytest.raises(InvalidWorkflowError, match=message):
        build()


def test_a_dag_with_an_unknown_need_or_a_cycle_is_refused_and_sends_nothing(
    queue: JobQueue, session: Session, conn: sa.Connection
) -> None:
    unknown = Dag().add("a", Call("step"), needs=["nope"])
    cycle = Dag().add("a", Call("step"), needs=["c"]).add("b", Call("step"), needs=["a"])
    cycle.add("c", Call("step"), needs=["b"]).add("d", Call("step"))
    before = conn.execute(sa.select(func.count()).select_from(jobs_table)).scalar_one()
    with pytest.raises(InvalidWorkflowError, match="'nope': no such step"):
        queue.workflow(session, unknown)
    with pytest.raises(InvalidWorkflowError, match="'a', 'b', 'c' need each other"):
        queue.workflow(session, cycle)
    with pytest.raises(InvalidWorkflowError, match="at least one"):
        queue.workflow(session, Dag())
    with pytest.raises(InvalidWorkflowError, match="at least one job"):
        queue.chain(session, [])
    assert isinstance(InvalidWorkflowError(), InvalidJobError)
    after = conn.execute(sa.select(func.count()).select_from(jobs_table)).scalar_one()
    assert after == before
    queue.enqueue(session, "step")  # the transaction is still usable


def test_an_unknown_workflow_raises_for_every_operation(queue: JobQueue, session: Session) -> None:
    missing = Workflow(987_654_321)
    for call in (missing.read, missing.cancel, missing.retry, missing.delete):
        with pytest.raises(UnknownWorkflowError, match="no workflow with id 987654321"):
            call(session)
    with pytest.raises(UnknownWorkflowError):
        queue.add_steps(session, 987_654_321, Dag().add("x", Call("step")))
    with pytest.raises(InvalidJobError, match="a workflow id is an int"):
        get_workflow(session, "7")  # type: ignore[arg-type]
    queue.enqueue(session, "step")  # nothing was lost: the transaction is usable


def test_cancel_ends_what_waits_and_is_queued_and_asks_running_jobs_to_stop(
    queue: JobQueue, session: Session, conn: sa.Connection
) -> None:
    chain = queue.chain(session, [Call("step")] * 4)
    outside = queue.enqueue(session, "step", depends_on=[chain[3]])  # not of the workflow
    end(conn, chain[0], "succeeded")
    start(conn, chain[1])
    change = chain.cancel(session)
    assert (change.changed, change.requested, change.left) == (2, 1, 1)
    assert status(conn, *chain) == ["succeeded", "running", "cancelled", "cancelled"]
    assert conn.execute(sa.select(j.cancel_requested).where(j.id == chain[1])).scalar_one()
    # What waited outside the workflow is settled by its edge's policy, as for any cancel.
    assert status(conn, outside) == ["cancelled"]
    assert pending(conn, outside, chain[3]) is False
    # The running job's worker ends it cancelled; its dependent is cancelled already.
    end(conn, chain[1], "cancelled")
    assert chain.read(session).state == "failed"
    again = cancel_workflow(session, chain.id)
    assert (again.changed, again.requested, again.left) == (0, 0, 4)


def test_retry_brings_back_a_failed_step_and_what_it_cancelled_waiting_for_it(
    queue: JobQueue, session: Session, conn: sa.Connection
) -> None:
    a, b, c = chain = queue.chain(session, [Call("step")] * 3)
    end(conn, a, "succeeded")
    end(conn, b, "dead")
    assert status(conn, c) == ["cancelled"]
    assert pending(conn, c, b) is False
    change = chain.retry(session)
    assert (change.changed, change.waiting, change.left) == (2, 1, 0)
    assert status(conn, a, b, c) == ["succeeded", "queued", "waiting"]
    assert pending(conn, c, b) is True  # c waits for b's new run
    # b's new run ends: c is released once, by the same settling as any ending.
    end(conn, b, "succeeded")
    assert status(conn, c) == ["queued"]
    assert pending(conn, c, b) is False
    end(conn, c, "succeeded")
    assert chain.read(session).state == "succeeded"
    assert chain.retry(session).changed == 0  # nothing dead or cancelled: nothing to do


def test_retry_after_a_cancel_restores_the_whole_unfinished_part(
    queue: JobQueue, session: Session, conn: sa.Connection
) -> None:
    *members, callback = chord = queue.chord(session, [Call("step")] * 3, Call("step"))
    end(conn, members[0], "succeeded")
    chord.cancel(session)
    assert status(conn, *chord) == ["succeeded", "cancelled", "cancelled", "cancelled"]
    change = chord.retry(session, attempts="reset")
    assert (change.changed, change.waiting) == (3, 1)
    assert status(conn, *chord) == ["succeeded", "queued", "queued", "waiting"]
    assert [pending(conn, callback, m) for m in members] == [False, True, True]
    end(conn, members[1], "succeeded")
    assert status(conn, callback) == ["waiting"]
    end(conn, members[2], "dead")
    assert status(conn, callback) == ["cancelled"]  # its edges' policy, as on the first run


def test_retry_makes_a_waiting_job_wait_for_the_new_run_of_what_it_ran_past(
    queue: JobQueue, session: Session, conn: sa.Connection
) -> None:
    dag = Dag().add("a", Call("step")).add("b", Call("step"))
    dag.add("c", Call("step"), needs=["a", "b"], on_failure="run")
    flow = queue.workflow(session, dag)
    s = flow.steps
    end(conn, s["a"], "dead")  # c's edge from a is settled; c still waits for b
    assert status(conn, s["c"]) == ["waiting"]
    flow.retry(session)
    assert pending(conn, s["c"], s["a"]) is True
    end(conn, s["b"], "succeeded")
    assert status(conn, s["c"]) == ["waiting"]  # a's new run has not ended
    end(conn, s["a"], "succeeded")
    assert status(conn, s["c"]) == ["queued"]


def test_retry_leaves_what_a_failed_job_outside_the_workflow_cancelled(
    queue: JobQueue, session: Session, conn: sa.Connection
) -> None:
    before = queue.enqueue(session, "step")
    chain = queue.chain(session, [Call("step")] * 2, depends_on=[before])
    other = queue.group(session, [Call("step")])
    end(conn, before, "dead")
    assert status(conn, *chain) == ["cancelled", "cancelled"]
    change = chain.retry(session)
    assert (change.changed, change.left) == (0, 2)
    assert status(conn, before, *chain) == ["dead", "cancelled", "cancelled"]
    assert status(conn, *other) == ["queued"]  # another workflow: untouched


def test_retry_leaves_a_job_whose_unique_key_is_held(
    queue: JobQueue, session: Session, conn: sa.Connection
) -> None:
    chain = queue.chain(session, [Call("keyed", {"key": "k"}), Call("step")])
    end(conn, chain[0], "dead")
    holder = queue.enqueue(session, "keyed", {"key": "k"})
    assert holder.created
    change = chain.retry(session)
    assert (change.changed, change.left) == (0, 2)
    end(conn, holder, "succeeded")
    assert chain.retry(session).changed == 2


def test_delete_refuses_an_unfinished_workflow_unless_forced_and_never_a_running_one(
    queue: JobQueue, session: Session, conn: sa.Connection
) -> None:
    chain = queue.chain(session, [Call("step")] * 3)
    outside = queue.enqueue(session, "step", depends_on=[chain[2]])
    with pytest.raises(WorkflowNotFinishedError, match="3 jobs waiting, queued or running"):
        chain.delete(session)
    start(conn, chain[0])
    with pytest.raises(WorkflowNotFinishedError, match="1 jobs running"):
        chain.delete(session, force=True)
    assert status(conn, *chain) == ["running", "waiting", "waiting"]  # nothing changed
    end(conn, chain[0], "succeeded")
    change = delete_workflow(session, chain.id, force=True)
    assert change.changed == 3
    assert status(conn, *chain) == ["gone", "gone", "gone"]
    # The job outside was settled by the forced cancel and keeps its (settled) edge.
    assert status(conn, outside) == ["cancelled"]
    assert pending(conn, outside, chain[2]) is False
    edges = conn.execute(sa.select(func.count()).where(e.job_id.in_(list(chain)))).scalar_one()
    assert edges == 0
    with pytest.raises(UnknownWorkflowError):
        chain.read(session)


def test_a_finished_workflow_is_deleted_with_its_edges_and_nothing_else(
    queue: JobQueue, session: Session, conn: sa.Connection
) -> None:
    keep = queue.chain(session, [Call("step")] * 2)
    chord = queue.chord(session, [Call("step")] * 2, Call("step"))
    for job_id in chord:
        end(conn, job_id, "succeeded")
    assert retry_workflow(session, chord.id).changed == 0
    assert chord.delete(session).changed == 3
    assert status(conn, *keep) == ["queued", "waiting"]
    assert pending(conn, keep[1], keep[0]) is True


def test_steps_added_to_a_running_workflow_need_its_steps_by_name(
    queue: JobQueue, session: Session, conn: sa.Connection
) -> None:
    flow = queue.workflow(session, Dag().add("a", Call("step")).add("b", Call("step")))
    end(conn, flow.steps["a"], "succeeded")
    end(conn, flow.steps["b"], "dead")
    extra = Dag().add("after_a", Call("step"), needs=["a"])
    extra.add("after_b", Call("step"), needs=["b"])
    extra.add("after_both", Call("step"), needs=["after_a", "b"], on_failure="run")
    added = queue.add_steps(session, flow.id, extra)
    assert added.id == flow.id
    s = added.steps
    # a met need; a failed need's policy applies at once; a new need pending.
    assert status(conn, s["after_a"], s["after_b"], s["after_both"]) == [
        "queued",
        "cancelled",
        "waiting",
    ]
    info = get_workflow(session, flow.id)
    assert set(info.steps) == {"a", "b", "after_a", "after_b", "after_both"}
    with pytest.raises(InvalidWorkflowError, match="has steps named 'a' already"):
        queue.add_steps(session, flow.id, Dag().add("a", Call("step")))
    with pytest.raises(InvalidWorkflowError, match="'z': no such step"):
        queue.add_steps(session, flow.id, Dag().add("y", Call("step"), needs=["z"]))
    with pytest.raises(UnknownJobError):
        queue.add_steps(session, flow.id, Dag().add("y", Call("step"), needs=[2**40]))


def test_retry_leaves_a_job_that_cannot_be_given_more_attempts_and_what_waits_for_it(
    queue: JobQueue, session: Session, conn: sa.Connection
) -> None:
    head, tail = chain = queue.chain(session, [Call("step"), Call("step")])
    end(conn, head, "dead")
    most = 2**31 - 1
    conn.execute(sa.update(jobs_table).where(j.id == head).values(attempts=most, max_attempts=most))
    change = chain.retry(session)
    assert (change.changed, change.left) == (0, 2)
    assert pending(conn, tail, head) is False  # no edge left pending for a job kept dead
    assert chain.retry(session, attempts="reset").changed == 2
    assert status(conn, head, tail) == ["queued", "waiting"]
