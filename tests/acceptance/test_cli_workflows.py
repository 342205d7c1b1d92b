"""``sa-jobqueue workflows show|cancel|retry|delete ID``, run in-process through ``cli.main``:
what the commands print (JSON parsed, text read) and what they change in the database."""

from __future__ import annotations

import json
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import func
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sa_jobqueue import JobContext, JobQueue, cli
from sa_jobqueue.models import jobs_table
from sa_jobqueue.workflows import Call, Dag, Workflow
from tests.helpers.databases import url_string
from tests.helpers.jobs import status_by_id

j = jobs_table.c


class Run:
    """Runs ``sa-jobqueue ...`` against the test's database and keeps what it printed."""

    def __init__(self, url: URL, capsys: pytest.CaptureFixture[str]) -> None:
        self.url = url_string(url)
        self.capsys = capsys
        self.out = self.err = ""

    def __call__(self, *args: str) -> int:
        self.capsys.readouterr()
        status = cli.main([*args, "--database-url", self.url])
        self.out, self.err = self.capsys.readouterr()
        return status

    def json(self, *args: str) -> Any:
        assert self(*args, "--json") == 0, self.err
        return json.loads(self.out)


@pytest.fixture
def run(database_url: URL, capsys: pytest.CaptureFixture[str]) -> Run:
    return Run(database_url, capsys)


def make_queue() -> JobQueue:
    queue = JobQueue()

    @queue.task
    def step(ctx: JobContext, payload: Any) -> None:
        """Never run here."""

    return queue


def fail(engine: sa.Engine, job_id: int) -> None:
    """End queued ``job_id`` dead as a worker would, settling what waits for it."""
    with engine.begin() as conn:
        conn.execute(
            sa.update(jobs_table)
            .where(j.id == job_id)
            .values(status="dead", attempts=1, started_at=func.now(), finished_at=func.now())
        )
        conn.execute(sa.select(func.sa_jobqueue_settle([job_id], ["dead"])))


def dag(engine: sa.Engine) -> Workflow:
    flow = Dag().add("fetch", Call("step")).add("parse", Call("step"), needs=["fetch"])
    with Session(engine) as session, session.begin():
        return make_queue().workflow(session, flow.add("store", Call("step"), needs=["parse"]))


def test_show_prints_the_jobs_their_steps_and_what_each_waits_for(
    run: Run, engine: sa.Engine
) -> None:
    flow = dag(engine)
    assert run("workflows", "show", str(flow.id)) == 0, run.err
    head, _, *rows = run.out.strip().splitlines()
    assert head == f"workflow {flow.id}: active (2 waiting, 1 queued)"
    assert rows[0].split()[:4] == ["ID", "STEP", "TASK", "STATUS"]
    assert rows[1].split()[:4] == [str(flow[0]), "fetch", "step", "queued"]
    assert rows[2].split()[:4] == [str(flow[1]), "parse", "step", "waiting"]
    assert rows[2].endswith(f"{flow[0]} (pending)")
    shown = run.json("workflows", "show", str(flow.id))
    assert shown["id"] == flow.id
    assert [job["step"] for job in shown["jobs"]] == ["fetch", "parse", "store"]
    assert [(x["job_id"], x["depends_on"]) for x in shown["edges"]] == [
        (flow[1], flow[0]),
        (flow[2], flow[1]),
    ]


def test_cancel_then_retry_then_delete(run: Run, engine: sa.Engine) -> None:
    flow = dag(engine)
    fail(engine, flow[0])
    assert status_by_id(engine) == {flow[0]: "dead", flow[1]: "cancelled", flow[2]: "cancelled"}
    assert run("workflows", "retry", str(flow.id)) == 0, run.err
    assert run.out.strip() == f"workflow {flow.id}: 3 job(s) back (2 waiting for others)"
    assert run.json("workflows", "cancel", str(flow.id)) == {
        "workflow_id": flow.id,
        "changed": 3,
        "requested": 0,
        "waiting": 0,
        "left": 0,
    }
    assert set(status_by_id(engine).values()) == {"cancelled"}
    assert run("workflows", "delete", str(flow.id)) == 0, run.err
    assert run.out.strip() == f"workflow {flow.id}: 3 job(s) deleted"
    assert status_by_id(engine) == {}


def test_delete_of_an_active_workflow_is_refused_unless_forced(run: Run, engine: sa.Engine) -> None:
    flow = dag(engine)
    assert run("workflows", "delete", str(flow.id)) == 1
    assert run.err.strip() == (
        f"sa-jobqueue: workflow {flow.id} has 3 jobs waiting, queued or running"
        " (cancel it first, or delete with force)"
    )
    assert len(status_by_id(engine)) == 3
    assert run("workflows", "delete", str(flow.id), "--force") == 0, run.err
    assert status_by_id(engine) == {}


@pytest.mark.parametrize("action", ["show", "cancel", "retry", "delete"])
def test_an_unknown_workflow_is_one_line_and_status_1(run: Run, action: str) -> None:
    assert run("workflows", action, "424242") == 1
    assert run.err.strip() == (
        "sa-jobqueue: no workflow with id 424242 (never created, not committed, or deleted)"
    )
