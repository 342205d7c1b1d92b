"""A workflow's own page and its API (``/workflows/{id}``, ``/api/v1/workflows/{id}``): its
jobs and states, and the cancel, retry and delete buttons and routes, over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import func
from sqlalchemy.orm import Session
from starlette.testclient import TestClient

from sa_jobqueue import JobContext, JobQueue
from sa_jobqueue.models import jobs_table
from sa_jobqueue.web import create_app
from sa_jobqueue.workflows import Call, Dag, Workflow
from tests.helpers.jobs import status_by_id
from tests.helpers.pages import LOCAL, forms, links, post_form

API = "/api/v1"
j = jobs_table.c


def make_queue() -> JobQueue:
    queue = JobQueue()

    @queue.task
    def step(ctx: JobContext, payload: Any) -> None:
        """Never run here."""

    return queue


@pytest.fixture
def client(engine: sa.Engine) -> Iterator[TestClient]:
    with TestClient(create_app(engine, allow_actions=True), base_url=LOCAL) as client:
        yield client


def build(engine: sa.Engine) -> Workflow:
    dag = Dag().add("fetch", Call("step")).add("parse", Call("step"), needs=["fetch"])
    with Session(engine) as session, session.begin():
        return make_queue().workflow(session, dag)


def fail(engine: sa.Engine, job_id: int) -> None:
    """End queued ``job_id`` dead as a worker would, settling what waits for it."""
    with engine.begin() as conn:
        conn.execute(
            sa.update(jobs_table)
            .where(j.id == job_id)
            .values(status="dead", attempts=1, started_at=func.now(), finished_at=func.now())
        )
        conn.execute(sa.select(func.sa_jobqueue_settle([job_id], ["dead"])))


def test_the_page_lists_the_jobs_and_its_buttons_cancel_retry_and_delete(
    engine: sa.Engine, client: TestClient
) -> None:
    flow = build(engine)
    page = client.get(f"/workflows/{flow.id}").text
    assert 'id="workflow-state">active<' in page
    assert "2 job(s): 1 waiting, 1 queued" in page
    assert f"/jobs/{flow.steps['fetch']}" in links(page)
    assert [f.action.rsplit("/", 1)[1] for f in forms(page)] == ["cancel"]
    job_page = client.get(f"/jobs/{flow.steps['parse']}").text
    assert f'href="/workflows/{flow.id}"' in job_page
    assert "(step parse)" in job_page

    cancel = post_form(page, f"/workflows/{flow.id}/cancel")
    shown = client.post(cancel.action, data=cancel.fields).text
    assert f"workflow {flow.id}: 2 job(s) cancelled" in shown
    assert set(status_by_id(engine).values()) == {"cancelled"}

    retry = post_form(shown, f"/workflows/{flow.id}/retry")
    shown = client.post(retry.action, data=retry.fields).text
    assert f"workflow {flow.id}: 2 job(s) back (1 waiting for others)" in shown
    assert status_by_id(engine) == {flow[0]: "queued", flow[1]: "waiting"}

    fail(engine, flow[0])
    page = client.get(f"/workflows/{flow.id}").text
    assert 'id="workflow-state">failed<' in page
    delete = post_form(page, f"/workflows/{flow.id}/delete")
    done = client.post(delete.action, data=delete.fields, follow_redirects=False)
    assert done.status_code == 303
    assert done.headers["location"] == "/jobs"
    assert status_by_id(engine) == {}
    assert client.get(f"/workflows/{flow.id}").status_code == 404


def test_a_form_without_its_token_changes_nothing(engine: sa.Engine, client: TestClient) -> None:
    flow = build(engine)
    refused = client.post(f"/workflows/{flow.id}/cancel", data={})
    assert refused.status_code == 403
    assert status_by_id(engine) == {flow[0]: "queued", flow[1]: "waiting"}


def test_the_api_reads_a_workflow_and_acts_on_it(engine: sa.Engine, client: TestClient) -> None:
    flow = build(engine)
    shown = client.get(f"{API}/workflows/{flow.id}").json()
    assert (shown["id"], shown["state"], shown["total"]) == (flow.id, "active", 2)
    assert shown["counts"] == {"waiting": 1, "queued": 1}
    assert [(x["id"], x["step"], x["status"]) for x in shown["jobs"]] == [
        (flow[0], "fetch", "queued"),
        (flow[1], "parse", "waiting"),
    ]
    assert shown["jobs_complete"] is True
    job = client.get(f"{API}/jobs/{flow[1]}").json()
    assert (job["workflow_id"], job["workflow_step"]) == (flow.id, "parse")

    refused = client.post(f"{API}/workflows/{flow.id}/delete", json={})
    assert refused.status_code == 409
    assert refused.json()["error"]["type"] == "conflict"
    assert "cancel it first, or delete with force" in refused.json()["error"]["message"]
    done = client.post(f"{API}/workflows/{flow.id}/cancel", json={})
    assert done.json() == {
        "ok": True,
        "message": f"workflow {flow.id}: 2 job(s) cancelled, cancellation requested of 0 running",
    }
    back = client.post(f"{API}/workflows/{flow.id}/retry", json={"attempts": "reset"})
    assert back.json()["ok"] is True
    assert status_by_id(engine) == {flow[0]: "queued", flow[1]: "waiting"}
    forced = client.post(f"{API}/workflows/{flow.id}/delete", json={"force": True})
    assert forced.json()["message"] == f"workflow {flow.id}: 2 job(s) deleted"
    assert status_by_id(engine) == {}


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "kind"),
    [
        ("get", "/workflows/4242", None, 404, "not_found"),
        ("post", "/workflows/4242/cancel", {}, 404, "not_found"),
        ("post", "/workflows/{id}/explode", {}, 404, "not_found"),
        ("post", "/workflows/{id}/cancel", {"force": True}, 422, "invalid_request"),
        ("post", "/workflows/{id}/delete", {"force": "yes"}, 422, "invalid_request"),
        ("post", "/workflows/{id}/retry", {"attempts": "all"}, 422, "invalid_request"),
    ],
)
def test_the_api_says_what_it_refuses(
    engine: sa.Engine,
    client: TestClient,
    method: str,
    path: str,
    body: Any,
    status: int,
    kind: str,
) -> None:
    flow = build(engine)
    url = API + path.replace("{id}", str(flow.id))
    answer = client.get(url) if method == "get" else client.post(url, json=body)
    assert answer.status_code == status, answer.text
    assert answer.json()["error"]["type"] == kind
    assert status_by_id(engine) == {flow[0]: "queued", flow[1]: "waiting"}
