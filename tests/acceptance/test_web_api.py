"""The dashboard's JSON API over HTTP (Starlette's TestClient), against PostgreSQL, committed rows.

Every route answers the pages' data as JSON with stable field names; every action changes the
database as its button does, and only behind the protections: actions allowed, a JSON body
(``Content-Type: application/json``), the Origin and Host checks, ``authorize``. Bad input
gets a typed error with its status code.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from sqlalchemy import func, select
from starlette.requests import Request
from starlette.testclient import TestClient

from sa_jobqueue.models import dependencies_table, jobs_table, periodic_table
from sa_jobqueue.ops import paused_queues, queue_limits
from sa_jobqueue.web import create_app
from tests.helpers.dashboard_history import recording
from tests.helpers.job_states import add_dead, add_job, add_worker
from tests.helpers.pages import LOCAL

j = jobs_table.c
API = "/api/v1"


def status_of(engine: sa.Engine, job_id: int) -> str | None:
    with engine.connect() as conn:
        found: str | None = conn.execute(select(j.status).where(j.id == job_id)).scalar()
    return found


def statuses(engine: sa.Engine) -> dict[int, str]:
    with engine.connect() as conn:
        return {row.id: row.status for row in conn.execute(select(j.id, j.status))}


def error_of(response: object, status: int, kind: str) -> str:
    """The message of a typed JSON error, after checking its status and type."""
    assert getattr(response, "status_code", None) == status, getattr(response, "text", "")
    body = response.json()  # type: ignore[attr-defined]
    assert set(body) == {"error"}
    assert body["error"]["type"] == kind
    message: str = body["error"]["message"]
    assert message
    return message


@pytest.fixture
def jobs(engine: sa.Engine) -> dict[str, int]:
    """A queue in every state, a dependency, a worker and a schedule, committed."""
    with engine.begin() as conn:
        ids = {
            "queued": add_job(conn, queue="emails", task="app.send", visible_in=-5),
            "scheduled": add_job(conn, queue="emails", task="app.send", visible_in=600),
            "running": add_job(
                conn, queue="emails", status="running", attempts=1, started_ago=2, visible_in=28
            ),
            "succeeded": add_job(
                conn, queue="emails", status="succeeded", attempts=1, finished_ago=30
            ),
            "dead": add_dead(conn, queue="emails", task="app.send", finished_ago=60),
            "dead2": add_dead(conn, queue="reports", task="app.report", created_ago=7200),
        }
        ids["waiting"] = add_job(conn, queue="reports", task="app.after", status="waiting")
        conn.execute(
            sa.insert(dependencies_table).values(
                job_id=ids["waiting"], depends_on=ids["dead2"], on_failure="run", pending=True
            )
        )
        add_worker(conn, "host-a:4242:0badcafe")
        conn.execute(sa.insert(periodic_table).values(name="app.nightly", last_tick=func.now()))
    return ids


@pytest.fixture
def client(engine: sa.Engine) -> Iterator[TestClient]:
    with TestClient(create_app(engine, allow_actions=True), base_url=LOCAL) as client:
        yield client


def same_statements_as_the_pages(
    client: TestClient, engine: sa.Engine, jobs: dict[str, int]
) -> None:
    """No second copy of a query: each read sends what its page sends, parameters included."""
    pairs = [
        ("/", f"{API}/overview"),
        ("/jobs?status=dead&limit=5", f"{API}/jobs?status=dead&limit=5"),
        ("/jobs?task=app.send&order=oldest", f"{API}/jobs?task=app.send&order=oldest"),
        (f"/jobs/{jobs['waiting']}", f"{API}/jobs/{jobs['waiting']}"),
        (f"/jobs/{jobs['waiting']}/workflow", f"{API}/jobs/{jobs['waiting']}/workflow"),
        (f"/jobs/{jobs['dead']}/payload.json", f"{API}/jobs/{jobs['dead']}/payload"),
        ("/queues?name=emails", f"{API}/queues/emails"),
        ("/periodic", f"{API}/periodic"),
        ("/purge?status=dead&older_than=1h", f"{API}/purge?status=dead&older_than=1h"),
    ]
    for page, api in pairs:
        with recording(engine) as by_page:
            assert client.get(page).status_code == 200
        with recording(engine) as by_api:
            assert client.get(api).status_code == 200
        assert by_page
        assert by_api == by_page, api


def moment(text: str) -> datetime:
    """An ISO 8601 moment, which must carry its offset."""
    parsed = datetime.fromisoformat(text)
    assert parsed.utcoffset() is not None, text
    return parsed


def test_every_read_answers_the_pages_data(
    client: TestClient, engine: sa.Engine, jobs: dict[str, int]
) -> None:
    index = client.get(f"{API}/").json()
    assert index["api_version"] == 1
    assert index["actions_allowed"] is True

    overview = client.get(f"{API}/overview")
    assert overview.headers["content-type"] == "application/json"
    assert "access-control-allow-origin" not in overview.headers
    data = overview.json()
    moment(data["as_of"])
    queues = {q["name"]: q for q in data["queues"]}
    assert set(queues) == {"emails", "reports"}
    emails = queues["emails"]
    assert (emails["queued"], emails["due"], emails["running"], emails["dead"]) == (2, 1, 1, 1)
    assert emails["finished_last_hour"]["succeeded"] == 1
    assert emails["limits"] == {
        "concurrency": None,
        "rate": None,
        "key_field": None,
        "key_concurrency": None,
        "key_rate": None,
    }
    assert queues["reports"]["waiting"] == 1
    assert [w["name"] for w in data["workers"]] == ["host-a:4242:0badcafe"]
    assert {f["check"] for f in data["findings"]} >= {"schema", "dead_jobs"}
    assert data["next_queues_after"] is None

    workers = client.get(f"{API}/workers").json()["workers"]
    assert workers[0]["pid"] == 4242
    assert workers[0]["queues"]
    moment(workers[0]["last_seen_at"])

    queue = client.get(f"{API}/queues/emails").json()
    assert queue["queue"]["name"] == "emails"
    assert queue["queue"]["held_back_by"] == ["no worker"]  # the worker serves "default"
    assert queue["workers"] == []

    job = client.get(f"{API}/jobs/{jobs['dead']}").json()
    assert (job["id"], job["status"], job["attempts"]) == (jobs["dead"], "dead", 3)
    assert job["payload"] == {"n": 1}
    assert job["payload_complete"] is True
    assert job["last_error"]["message"] == "bad input"
    assert job["lease_seconds"] > 0
    moment(job["created_at"])
    assert job["result"] is None
    assert job["waits_for"] == []
    waiting = client.get(f"{API}/jobs/{jobs['waiting']}").json()
    assert waiting["waits_for"] == [
        {
            "id": jobs["dead2"],
            "task": "app.report",
            "status": "dead",
            "on_failure": "run",
            "pending": True,
        }
    ]
    assert waiting["waits_for_count"] == 1
    assert client.get(f"{API}/jobs/{jobs['dead']}/payload").json() == {"n": 1}

    graph = client.get(f"{API}/jobs/{jobs['waiting']}/workflow").json()
    assert {n["id"]: n["layer"] for n in graph["nodes"]} == {jobs["dead2"]: 0, jobs["waiting"]: 1}
    assert graph["edges"] == [
        {
            "job_id": jobs["waiting"],
            "depends_on": jobs["dead2"],
            "on_failure": "run",
            "pending": True,
        }
    ]

    periodic = client.get(f"{API}/periodic").json()
    assert [s["name"] for s in periodic["schedules"]] == ["app.nightly"]
    assert periodic["declared"] is False
    assert periodic["schedules"][0]["cron"] is None

    purge = client.get(f"{API}/purge", params={"status": "dead", "older_than": "0"}).json()
    assert (purge["matching"], purge["more"], purge["statuses"]) == (2, False, ["dead"])

    same_statements_as_the_pages(client, engine, jobs)


def test_the_jobs_list_filters_and_pages_as_the_html_list(
    client: TestClient, engine: sa.Engine, jobs: dict[str, int]
) -> None:
    dead = client.get(f"{API}/jobs", params={"status": "dead"}).json()
    assert [job["id"] for job in dead["jobs"]] == [jobs["dead2"], jobs["dead"]]
    assert dead["filter"]["statuses"] == ["dead"]
    assert dead["jobs"][0]["error_message"] == "bad input"
    old = client.get(f"{API}/jobs", params={"older_than": "1h", "task": "app.send"}).json()
    assert old["filter"]["older_than_seconds"] == 3600.0
    assert old["filter"]["task"] == "app.send"

    # Keyset pages of two: the next link carries the filter and the bound; nothing repeats.
    seen: list[int] = []
    page = client.get(f"{API}/jobs", params={"limit": 2, "order": "oldest"}).json()
    while True:
        seen += [job["id"] for job in page["jobs"]]
        if page["next"] is None:
            break
        assert page["next"].startswith(f"{API}/jobs?")
        page = client.get(page["next"]).json()
    assert seen == sorted(jobs.values())
    back = client.get(page["previous"]).json()
    assert [job["id"] for job in back["jobs"]] == seen[-3:-1]

    # Mounted under a prefix, the links carry it.
    outer = FastAPI()
    outer.mount("/ops", create_app(engine))
    with TestClient(outer, base_url=LOCAL) as mounted:
        first = mounted.get(f"/ops{API}/jobs", params={"limit": 2}).json()
        assert first["next"].startswith(f"/ops{API}/jobs?")
        assert mounted.get(first["next"]).json()["jobs"][0]["id"] < first["jobs"][-1]["id"]
        error_of(mounted.get(f"/ops{API}/nowhere"), 404, "not_found")

    for path, status, kind in BAD_READS:
        error_of(client.get(path), status, kind)


def test_the_jobs_list_filters_by_tags_and_a_job_shows_them(
    client: TestClient, engine: sa.Engine
) -> None:
    with engine.begin() as conn:
        both = add_job(conn, tags=["billing", "customer:42"], meta={"request": "r-1"})
        billing = add_job(conn, tags=["billing"])
        plain = add_job(conn)

    billed = client.get(f"{API}/jobs", params={"tag": "billing"}).json()
    assert [job["id"] for job in billed["jobs"]] == [billing, both]  # newest first
    assert billed["filter"]["tags"] == ["billing"]
    assert [job["tags"] for job in billed["jobs"]] == [["billing"], ["billing", "customer:42"]]
    # Repeated, or several in one parameter: the jobs carrying all of them.
    for params in ([("tag", "billing"), ("tag", "customer:42")], {"tag": "billing,customer:42"}):
        found = client.get(f"{API}/jobs", params=params).json()
        assert [job["id"] for job in found["jobs"]] == [both]
        assert found["filter"]["tags"] == ["billing", "customer:42"]
    # The next link carries the tags.
    first = client.get(f"{API}/jobs", params={"tag": "billing", "limit": 1}).json()
    assert "tag=billing" in first["next"]
    assert [job["id"] for job in first["jobs"]] == [billing]
    assert [job["id"] for job in client.get(first["next"]).json()["jobs"]] == [both]

    shown = client.get(f"{API}/jobs/{both}").json()
    assert (shown["tags"], shown["meta"]) == (["billing", "customer:42"], {"request": "r-1"})
    bare = client.get(f"{API}/jobs/{plain}").json()
    assert (bare["tags"], bare["meta"]) == ([], None)

    # The HTML list and the job's page show them too, and link a tag to its list.
    page = client.get("/jobs", params={"tag": "customer:42"}).text
    assert f'href="/jobs/{both}"' in page
    assert f'href="/jobs/{billing}"' not in page
    assert 'href="/jobs?tag=customer%3A42"' in client.get(f"/jobs/{both}").text

    for bad in ("a/b", "-x", "x" * 65, ",".join(f"t{i}" for i in range(17))):
        error_of(client.get(f"{API}/jobs", params={"tag": bad}), 400, "invalid_parameter")


def test_a_job_shows_the_progress_its_worker_wrote(client: TestClient, engine: sa.Engine) -> None:
    with engine.begin() as conn:
        running = add_job(conn, status="running", attempts=1, started_ago=60)
        finished = add_job(conn, status="succeeded", attempts=1, started_ago=60)
        bare = add_job(conn)
        for job_id, fraction in ((running, 0.25), (finished, 1.0)):
            conn.execute(
                sa.update(jobs_table)
                .where(jobs_table.c.id == job_id)
                .values(progress=fraction, progress_message="<b>rows</b>", progress_at=func.now())
            )

    shown = client.get(f"{API}/jobs/{running}").json()
    assert (shown["progress"], shown["progress_message"]) == (0.25, "<b>rows</b>")
    assert datetime.fromisoformat(shown["progress_at"]).tzinfo is not None
    bare_json = client.get(f"{API}/jobs/{bare}").json()
    assert (bare_json["progress"], bare_json["progress_message"], bare_json["progress_at"]) == (
        None,
        None,
        None,
    )

    page = client.get(f"/jobs/{running}").text
    assert '<progress max="1" value="0.25">25%</progress> 25% &lt;b&gt;rows&lt;/b&gt;' in page
    assert "while its last attempt ran" not in page
    assert "while its last attempt ran" in client.get(f"/jobs/{finished}").text
    assert 'id="progress"' not in client.get(f"/jobs/{bare}").text


#: Reads the API refuses, with the status and type of its error.
BAD_READS = [
    (f"{API}/jobs?status=finished", 400, "invalid_parameter"),
    (f"{API}/jobs?stauts=dead", 400, "invalid_parameter"),
    (f"{API}/jobs?limit=100000", 400, "invalid_parameter"),
    (f"{API}/jobs?after=1&before=2", 400, "invalid_parameter"),
    (f"{API}/jobs?older_than=soon", 400, "invalid_parameter"),
    (f"{API}/overview?queues_after=" + "q" * 65, 400, "invalid_parameter"),
    (f"{API}/purge?status=queued&older_than=1h", 400, "invalid_parameter"),
    (f"{API}/purge?status=dead", 400, "invalid_parameter"),
    (f"{API}/jobs/999999999", 404, "not_found"),
    (f"{API}/jobs/99999999999999999999", 404, "not_found"),
    (f"{API}/jobs/999999999/workflow", 404, "not_found"),
    (f"{API}/jobs/999999999/payload", 404, "not_found"),
    (f"{API}/no/such/route", 404, "not_found"),
    (f"{API}/jobs/bulk", 405, "method_not_allowed"),
]


def test_single_job_actions_change_the_job_or_say_why_not(
    client: TestClient, engine: sa.Engine, jobs: dict[str, int]
) -> None:
    done = client.post(f"{API}/jobs/{jobs['dead']}/retry", json={"attempts": "reset"})
    assert done.status_code == 200, done.text
    assert done.json()["ok"] is True
    assert status_of(engine, jobs["dead"]) == "queued"
    assert "not dead" in error_of(
        client.post(f"{API}/jobs/{jobs['dead']}/retry", json={}), 409, "conflict"
    )

    assert client.post(f"{API}/jobs/{jobs['queued']}/cancel", json={}).status_code == 200
    assert status_of(engine, jobs["queued"]) == "cancelled"
    error_of(client.post(f"{API}/jobs/{jobs['queued']}/cancel", json={}), 409, "conflict")

    assert client.post(f"{API}/jobs/{jobs['scheduled']}/run_now", json={}).status_code == 200
    with engine.connect() as conn:
        due = conn.execute(
            select(j.visible_at <= func.now()).where(j.id == jobs["scheduled"])
        ).scalar()
    assert due is True
    error_of(client.post(f"{API}/jobs/{jobs['running']}/delete", json={}), 409, "conflict")
    assert status_of(engine, jobs["running"]) == "running"
    assert client.post(f"{API}/jobs/{jobs['succeeded']}/delete", json={}).status_code == 200
    assert status_of(engine, jobs["succeeded"]) is None

    error_of(client.post(f"{API}/jobs/999999999/cancel", json={}), 404, "not_found")
    error_of(client.post(f"{API}/jobs/{jobs['dead2']}/explode", json={}), 404, "not_found")
    error_of(
        client.post(f"{API}/jobs/{jobs['dead2']}/retry", json={"attempts": "all"}),
        422,
        "invalid_request",
    )
    error_of(
        client.post(f"{API}/jobs/{jobs['dead2']}/cancel", json={"force": True}),
        422,
        "invalid_request",
    )
    assert status_of(engine, jobs["dead2"]) == "dead"


#: Bulk requests the API refuses whole (422), changing nothing.
BAD_BULK = [
    {"action": "explode", "ids": [1]},
    {"action": "cancel"},
    {"action": "cancel", "ids": [1], "filter": {}},
    {"action": "cancel", "ids": "1"},
    {"action": "cancel", "ids": [True]},
    {"action": "cancel", "ids": list(range(1, 1003))},
    {"action": "cancel", "filter": {"statuses": ["finished"]}},
    {"action": "cancel", "filter": {"queue": ["emails"]}},
    {"action": "cancel", "filter": {"queues": "emails"}},
    {"action": "cancel", "filter": {"older_than": "soon"}},
    {"action": "cancel", "filter": {}, "confirm": "yes"},
    {"action": "retry", "filter": {}, "attempts": "all"},
]


def test_bulk_counts_first_then_runs_one_batch_when_confirmed(
    client: TestClient, engine: sa.Engine, jobs: dict[str, int]
) -> None:
    asked = {"action": "cancel", "filter": {"queue": "emails"}}
    before = statuses(engine)
    preview = client.post(f"{API}/jobs/bulk", json=asked).json()
    assert (preview["confirmed"], preview["matching"], preview["more"]) == (False, 3, False)
    assert statuses(engine) == before  # nothing changed without "confirm"

    done = client.post(f"{API}/jobs/bulk", json={**asked, "confirm": True}).json()
    assert (done["done"], done["cancel_requested"], done["left"], done["more"]) == (2, 1, 0, False)
    after = statuses(engine)
    assert after[jobs["queued"]] == after[jobs["scheduled"]] == "cancelled"
    assert after[jobs["dead2"]] == "dead"  # another queue

    by_ids = {"action": "retry", "ids": [jobs["dead"], jobs["dead2"]], "confirm": True}
    retried = client.post(f"{API}/jobs/bulk", json=by_ids).json()
    assert retried["done"] == 2
    assert retried["ok"] is True
    assert status_of(engine, jobs["dead2"]) == "queued"

    before = statuses(engine)
    for body in BAD_BULK:
        asked = {"confirm": True, **body}
        error_of(client.post(f"{API}/jobs/bulk", json=asked), 422, "invalid_request")
    assert statuses(engine) == before


def test_queue_actions_and_purge(
    client: TestClient, engine: sa.Engine, jobs: dict[str, int]
) -> None:
    assert client.post(f"{API}/queues/emails/pause").status_code == 415  # no JSON body
    assert client.post(f"{API}/queues/emails/pause", json={}).json()["ok"] is True
    with engine.connect() as conn:
        assert "emails" in paused_queues(conn)
    held = client.get(f"{API}/queues/emails").json()["queue"]
    assert held["held_back_by"][0] == "paused"
    assert held["paused_at"] is not None
    assert client.post(f"{API}/queues/emails/resume", json={}).status_code == 200
    with engine.connect() as conn:
        assert "emails" not in paused_queues(conn)

    limits = {
        "concurrency": 4,
        "rate": "50/s",
        "key_field": "customer",
        "key_concurrency": 1,
        "key_rate": None,
    }
    assert client.put(f"{API}/queues/emails/limits", json=limits).status_code == 200
    shown = client.get(f"{API}/queues/emails").json()["queue"]["limits"]
    assert shown["concurrency"] == 4
    assert shown["key_field"] == "customer"
    assert shown["rate"] == {"limit": 50, "period_seconds": 1.0, "text": "50/1s"}
    for bad in ({**limits, "concurrency": 0}, {**limits, "rate": "fast"}, {"concurrency": 2}):
        error_of(client.put(f"{API}/queues/emails/limits", json=bad), 422, "invalid_request")
    error_of(
        client.put(f"{API}/queues/emails/limits", json={**limits, "concurrency": "4"}),
        422,
        "invalid_request",
    )
    with engine.connect() as conn:
        assert queue_limits(conn)["emails"].concurrency == 4  # unchanged by the refusals
    error_of(client.post(f"{API}/queues/no%20such/pause", json={}), 422, "invalid_request")

    error_of(client.post(f"{API}/jobs/retry_dead", json={"queue": 5}), 422, "invalid_request")
    retried = client.post(f"{API}/jobs/retry_dead", json={"queue": "reports", "older_than": 0})
    assert retried.json() == {"ok": True, "message": "1 dead job(s) queued again"}
    assert status_of(engine, jobs["dead2"]) == "queued"

    purged = client.post(f"{API}/purge", json={"statuses": ["dead"], "older_than": "0"})
    assert purged.status_code == 200
    assert "purged 1" in purged.json()["message"]
    assert status_of(engine, jobs["dead"]) is None
    error_of(
        client.post(f"{API}/purge", json={"statuses": ["queued"], "older_than": "0"}),
        422,
        "invalid_request",
    )
    assert status_of(engine, jobs["queued"]) == "queued"


def test_actions_are_refused_without_their_protections_and_authorize_is_asked(
    engine: sa.Engine, jobs: dict[str, int]
) -> None:
    dead = f"{API}/jobs/{jobs['dead']}/retry"
    with TestClient(create_app(engine), base_url=LOCAL) as read_only:
        assert read_only.get(f"{API}/").json()["actions_allowed"] is False
        assert read_only.get(f"{API}/jobs").status_code == 200
        error_of(read_only.post(dead, json={}), 403, "actions_disabled")
        error_of(read_only.post(f"{API}/jobs/bulk", json={}), 403, "actions_disabled")
        error_of(read_only.put(f"{API}/queues/emails/limits", json={}), 403, "actions_disabled")
    with TestClient(create_app(engine, allow_actions=True), base_url=LOCAL) as client:
        # What a page of another site can make a browser send without a preflight.
        error_of(client.post(dead, data={"attempts": "reset"}), 415, "unsupported_media_type")
        plain = {"content-type": "text/plain"}
        error_of(client.post(dead, content=b"{}", headers=plain), 415, "unsupported_media_type")
        error_of(
            client.post(dead, json={}, headers={"origin": "https://evil.example"}),
            403,
            "cross_origin",
        )
        error_of(client.post(dead, json={}, headers={"origin": "null"}), 403, "cross_origin")
        # A preflight is never granted: no CORS header on any answer.
        preflight = client.options(
            dead,
            headers={"origin": "https://evil.example", "access-control-request-method": "POST"},
        )
        assert "access-control-allow-origin" not in preflight.headers
        json_type = {"content-type": "application/json"}
        error_of(client.post(dead, content=b"{nope", headers=json_type), 400, "invalid_json")
        error_of(client.post(dead, content=b"[1]", headers=json_type), 400, "invalid_json")
        big = b'{"x": "' + b"a" * 300_000 + b'"}'
        error_of(client.post(dead, content=big, headers=json_type), 413, "body_too_large")
        assert status_of(engine, jobs["dead"]) == "dead"
        # The dashboard's own address as Origin (a page of its own calling fetch) is fine.
        same = client.post(dead, json={}, headers={"origin": LOCAL})
        assert same.status_code == 200
    with TestClient(create_app(engine), base_url="http://rebound.example") as rebound:
        assert rebound.get(f"{API}/jobs").status_code == 400  # DNS rebinding: Host refused

    def staff_only(request: Request) -> bool:
        return request.headers.get("x-role") == "staff"

    app = create_app(engine, authorize=staff_only, allow_actions=True)
    with TestClient(app, base_url=LOCAL) as client:
        error_of(client.get(f"{API}/jobs"), 403, "not_authorized")
        other = f"{API}/jobs/{jobs['dead2']}/retry"
        error_of(client.post(other, json={}), 403, "not_authorized")
        assert status_of(engine, jobs["dead2"]) == "dead"
        staff = {"x-role": "staff"}
        assert client.get(f"{API}/jobs", headers=staff).status_code == 200
        done = client.post(other, json={}, headers=staff)
        assert done.status_code == 200
