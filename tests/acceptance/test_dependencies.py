"""Job dependencies: a job waits, outside the claim, until what it depends on has ended; the
edges are settled once, in the statement that ends each dependency (whatever ends it), or by
the enqueue's own check when the two race; a failed dependency cancels (by default) or lets
run what waits for it; a DAG of 1,000 jobs runs in order under real workers, one SIGKILLed."""

from __future__ import annotations

import json
import random
import signal
import threading
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from sa_jobqueue import JobContext, JobQueue
from sa_jobqueue._sql import claiming, transitions
from sa_jobqueue.errors import InvalidJobError, UnknownJobError
from sa_jobqueue.models import dependencies_table, jobs_table
from sa_jobqueue.testing import drain
from sa_jobqueue.worker._upkeep import Pruner
from sa_jobqueue.workflows import Dependency
from tests.apps import dag
from tests.helpers.jobs import statuses
from tests.helpers.processes import WorkerApp, Workers, run_cli

TABLES = dag.metadata
WORKER_APP = WorkerApp("tests.apps.dag:queue", log_level="WARNING")
j = jobs_table.c
e = dependencies_table.c


def make_queue(ran: list[int]) -> JobQueue:
    queue = JobQueue(default_queue="deps")

    @queue.task
    def step(ctx: JobContext, payload: Any) -> None:
        ran.append(payload["n"])

    @queue.task(max_attempts=1)
    def fails(ctx: JobContext, payload: Any) -> None:
        ran.append(payload["n"])
        raise RuntimeError("step failed")

    return queue


def status_of(engine: sa.Engine, *ids: int) -> list[str]:
    with engine.connect() as conn:
        found = dict(conn.execute(sa.select(j.id, j.status).where(j.id.in_(ids))).all())
    return [found[i] for i in ids]


def test_a_job_runs_after_its_dependencies_and_waits_outside_the_claim(engine: sa.Engine) -> None:
    ran: list[int] = []
    queue = make_queue(ran)
    with Session(engine) as session, session.begin():
        a = queue.enqueue(session, "step", {"n": 1})
        b = queue.enqueue(session, "step", {"n": 2}, depends_on=[a])
        c = queue.enqueue(session, "step", {"n": 3}, depends_on=[a, b])
        many = queue.enqueue_many(session, "step", [{"n": 4}, {"n": 5}], depends_on=[c])
    assert status_of(engine, a, b, c, *many) == [
        "queued",
        "waiting",
        "waiting",
        "waiting",
        "waiting",
    ]
    with engine.begin() as conn:  # the plain claim never sees a waiting job
        params = {"from_queue": "deps", "limit": 10, "worker": "w"}
        assert [row.id for row in conn.execute(claiming.claim(), params)] == [a]
        conn.rollback()
    assert drain(queue, engine).succeeded == 5
    assert ran[:3] == [1, 2, 3]
    assert sorted(ran[3:]) == [4, 5]
    with engine.connect() as conn:
        assert not conn.execute(sa.select(sa.func.count()).where(e.pending)).scalar()


def test_a_failed_dependency_cancels_by_default_and_runs_on_request(engine: sa.Engine) -> None:
    ran: list[int] = []
    queue = make_queue(ran)
    with Session(engine) as session, session.begin():
        bad = queue.enqueue(session, "fails", {"n": 1})
        cancelled = queue.enqueue(session, "step", {"n": 2}, depends_on=[bad])
        cascade = queue.enqueue(session, "step", {"n": 3}, depends_on=[cancelled])
        runs = queue.enqueue(
            session, "step", {"n": 4}, depends_on=[Dependency(bad, on_failure="run")]
        )
        after_runs = queue.enqueue(session, "step", {"n": 5}, depends_on=[runs, cascade])
    drain(queue, engine)
    assert status_of(engine, bad, cancelled, cascade, runs, after_runs) == [
        "dead",
        "cancelled",
        "cancelled",
        "succeeded",
        "cancelled",
    ]
    assert sorted(ran) == [1, 4]
    with Session(engine) as session:
        job = queue.get_job(session, cascade)
    assert job is not None
    assert job.last_error["type"] == "DependencyFailed"
    assert str(cancelled) in job.last_error["message"]


def test_dependencies_that_ended_before_the_enqueue(engine: sa.Engine) -> None:
    ran: list[int] = []
    queue = make_queue(ran)
    with Session(engine) as session, session.begin():
        ok = queue.enqueue(session, "step", {"n": 1})
        bad = queue.enqueue(session, "fails", {"n": 2})
    drain(queue, engine)
    with Session(engine) as session, session.begin():
        ready = queue.enqueue(session, "step", {"n": 3}, depends_on=[ok])
        gone = queue.enqueue(session, "step", {"n": 4}, depends_on=[ok, bad])
        anyway = queue.enqueue(session, "step", {"n": 5}, depends_on=[Dependency(bad, "run")])
    assert status_of(engine, ready, gone, anyway) == ["queued", "cancelled", "queued"]


def test_bad_dependencies_are_refused_and_insert_nothing(engine: sa.Engine) -> None:
    queue = make_queue([])
    with Session(engine) as session, session.begin():
        a = queue.enqueue(session, "step", {"n": 1})
        for bad in ([a, a], ["1"], [True], 5):
            with pytest.raises(InvalidJobError):
                queue.enqueue(session, "step", {"n": 2}, depends_on=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidJobError, match="on_failure is 'cancel' or 'run'"):
            Dependency(a, "maybe")  # type: ignore[arg-type]
        with pytest.raises(UnknownJobError, match="no job with id 999999"):
            queue.enqueue(session, "step", {"n": 3}, depends_on=[a, 999999])
        # The transaction goes on, and nothing was added.
        assert statuses(session.connection(), queue="deps") == Counter(queued=1)


def test_cancelling_a_waiting_job_cancels_what_waits_for_it(engine: sa.Engine) -> None:
    queue = make_queue([])
    with Session(engine) as session, session.begin():
        a = queue.enqueue(session, "step", {"n": 1})
        b = queue.enqueue(session, "step", {"n": 2}, depends_on=[a])
        c = queue.enqueue(session, "step", {"n": 3}, depends_on=[b])
    with Session(engine) as session, session.begin():
        assert queue.cancel(session, b)
    assert status_of(engine, a, b, c) == ["queued", "cancelled", "cancelled"]


# -- races and fencing ----------------------------------------------------------------------------


def claim_one(engine: sa.Engine) -> tuple[int, int]:
    with engine.begin() as conn:
        params = {"from_queue": "deps", "limit": 1, "worker": "w"}
        row = conn.execute(claiming.claim(), params).one()
    return row.id, row.attempts


def complete(conn: sa.Connection, job_id: int, attempt: int) -> int:
    params = {"job_ids": [job_id], "attempt_list": [attempt]}
    return len(conn.execute(transitions.complete_many(), params).all())


@pytest.mark.parametrize("first", ["completion", "enqueue"])
def test_a_dependency_ending_while_its_dependent_is_enqueued(engine: sa.Engine, first: str) -> None:
    """The completion of a job and the enqueue of a job that depends on it, in two
    transactions at once: whichever commits first, the dependent ends up queued."""
    queue = make_queue([])
    with Session(engine) as session, session.begin():
        dep = queue.enqueue(session, "step", {"n": 1})
    dep_id, attempt = claim_one(engine)
    assert dep_id == dep
    enqueuer = Session(engine)
    enqueuer.begin()
    waiting = queue.enqueue(enqueuer, "step", {"n": 2}, depends_on=[dep])  # sees dep running
    if first == "completion":
        # The completion commits before the enqueue, and cannot see its uncommitted edge.
        with engine.begin() as conn:
            assert complete(conn, dep_id, attempt) == 1
        enqueuer.commit()
    else:
        # The completion runs while the enqueue commits: the enqueue's check waits for it.
        completing = engine.connect()
        completing.begin()
        assert complete(completing, dep_id, attempt) == 1
        committed = threading.Event()
        thread = threading.Thread(target=lambda: (enqueuer.commit(), committed.set()))
        thread.start()
        assert not committed.wait(0.3)  # held by the completion's row lock
        completing.commit()
        thread.join(10)
        assert committed.is_set()
        completing.close()
    enqueuer.close()
    assert status_of(engine, dep, waiting) == ["succeeded", "queued"]


def test_a_stale_attempt_releases_nothing(engine: sa.Engine) -> None:
    queue = make_queue([])
    with Session(engine) as session, session.begin():
        dep = queue.enqueue(session, "step", {"n": 1}, lease=timedelta(milliseconds=1))
        waiting = queue.enqueue(session, "step", {"n": 2}, depends_on=[dep])
    _, first = claim_one(engine)
    # Its lease ran out: the next claim takes the job back as attempt 2.
    with engine.begin() as conn:
        conn.execute(sa.update(jobs_table).where(j.id == dep).values(visible_at=sa.func.now()))
    _, second = claim_one(engine)
    assert second == first + 1
    with engine.begin() as conn:
        assert complete(conn, dep, first) == 0  # the stale attempt: no row, nothing released
    assert status_of(engine, dep, waiting) == ["running", "waiting"]
    with engine.begin() as conn:
        assert complete(conn, dep, second) == 1
    assert status_of(engine, dep, waiting) == ["succeeded", "queued"]


# -- a DAG of 1,000 jobs under real workers ------------------------------------------------------


def build_dag(engine: sa.Engine) -> dict[int, list[int]]:
    """1 root; 10 after it; 100 (10 after each); 100 that each wait for 10 of those; 788 that
    each wait for 2 of those; one last that waits for all 788. Returns each job's dependencies."""
    rng = random.Random(7)
    deps: dict[int, list[int]] = {}
    with Session(engine) as session, session.begin():

        def add(name: str, after: list[int]) -> int:
            job_id = dag.queue.enqueue(session, "node", {"node": name, "ms": 2}, depends_on=after)
            deps[job_id] = after
            return int(job_id)

        root = add("root", [])
        level1 = [add(f"1.{i}", [root]) for i in range(10)]
        level2 = [add(f"2.{i}", [level1[i // 10]]) for i in range(100)]
        level3 = [add(f"3.{i}", [level2[(i + k) % 100] for k in range(10)]) for i in range(100)]
        level4 = [add(f"4.{i}", rng.sample(level3, 2)) for i in range(788)]
        add("last", level4)
    assert len(deps) == 1000
    return deps


@pytest.mark.slow
def test_a_dag_of_1000_jobs_runs_in_order_across_a_sigkill(
    tables: sa.Engine, workers: Workers
) -> None:
    engine = tables
    deps = build_dag(engine)
    ids = list(deps)
    first = workers.start(concurrency=4)
    workers.start(concurrency=4)
    workers.wait(lambda: statuses(engine, ids).get("succeeded", 0) >= 300, timeout=60)
    workers.signal(first, signal.SIGKILL)
    workers.start(concurrency=4)
    workers.wait(lambda: statuses(engine, ids) == {"succeeded": 1000}, timeout=120)
    workers.terminate_all()
    with engine.connect() as conn:
        started = dict(conn.execute(sa.select(dag.runs.c.job_id, dag.runs.c.started)).all())
        finished = dict(conn.execute(sa.select(j.id, j.finished_at).where(j.id.in_(ids))).all())
        count = conn.execute(sa.select(sa.func.count()).select_from(dag.runs)).scalar_one()
    assert count == 1000  # each node's effect written once
    late = [
        (job_id, dep)
        for job_id, after in deps.items()
        for dep in after
        if not started[job_id] > finished[dep]
    ]
    assert late == []


def test_jobs_show_lists_what_a_job_waits_for_and_what_waits_for_it(
    engine: sa.Engine, database_url: Any
) -> None:
    queue = make_queue([])
    with Session(engine) as session, session.begin():
        a = queue.enqueue(session, "step", {"n": 1})
        b = queue.enqueue(session, "step", {"n": 2})
        c = queue.enqueue(session, "step", {"n": 3}, depends_on=[a, Dependency(b, "run")])
    url = database_url.render_as_string(hide_password=False)
    shown = run_cli("jobs", "show", str(c), "--database-url", url)
    assert shown.returncode == 0, shown.stderr
    assert f"waits for:    {a} (pending), {b} (pending, runs on failure)" in shown.stdout
    assert "status:       waiting" in shown.stdout
    shown = run_cli("jobs", "show", str(a), "--database-url", url)
    assert f"waited on by: {c} (pending)" in shown.stdout
    data = json.loads(run_cli("jobs", "show", str(c), "--json", "--database-url", url).stdout)
    assert [edge["depends_on"] for edge in data["waits_for"]] == [a, b]
    assert data["waited_for_by"] == []


def test_pruning_deletes_settled_edges_of_pruned_jobs(engine: sa.Engine) -> None:
    queue = make_queue([])
    with Session(engine) as session, session.begin():
        a = queue.enqueue(session, "step", {"n": 1})
        b = queue.enqueue(session, "step", {"n": 2}, depends_on=[a])
        c = queue.enqueue(session, "step", {"n": 3}, depends_on=[b])
    drain(queue, engine)
    with engine.begin() as conn:  # b's row pruned (as after its retention); c's edge stays
        conn.execute(sa.delete(jobs_table).where(j.id == b))
    assert Pruner(engine, timedelta(days=1), timedelta(seconds=1)).prune() == 0
    with engine.connect() as conn:
        left = conn.execute(sa.select(e.job_id, e.depends_on)).all()
    assert left == [(c, b)]
