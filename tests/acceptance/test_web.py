"""The dashboard's every route with Starlette's TestClient against PostgreSQL, committed rows.

Pages render what the database holds; actions change it, once, behind the CSRF token and only
when allowed; hostile rows render escaped; the app mounted under /jobs in FastAPI keeps every
link under the prefix; a role with only SELECT renders every page; ``sa-jobqueue web`` serves
with a token and stops on SIGTERM.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx2
import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import URL
from starlette.testclient import TestClient

from sa_jobqueue.database import create_engine
from sa_jobqueue.models import dependencies_table, jobs_table, periodic_table, workers_table
from sa_jobqueue.ops import (
    paused_queues,
    set_queue_concurrency,
    set_queue_key_concurrency,
    set_queue_key_rate,
    set_queue_rate,
)
from sa_jobqueue.web import _reads, create_app
from sa_jobqueue.web._tokens import CSRF_FIELD
from tests.helpers.databases import admin_engine, unique_name, url_string
from tests.helpers.job_states import add_dead, add_job, add_worker
from tests.helpers.pages import LOCAL, forms, links, post_form
from tests.helpers.processes import CLI, REPO_ROOT, subprocess_env
from tests.helpers.waiting import wait_for

j = jobs_table.c
DOCS_PAGE = REPO_ROOT / "docs" / "how-to" / "dashboard.md"


def status_of(engine: sa.Engine, job_id: int) -> str:
    with engine.connect() as conn:
        status: str = conn.execute(select(j.status).where(j.id == job_id)).scalar_one()
    return status


@pytest.fixture
def jobs(engine: sa.Engine) -> dict[str, int]:
    """A queue in every state, committed: the ids by what they are."""
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
        add_worker(conn, "host-a:4242:0badcafe")
        conn.execute(sa.insert(periodic_table).values(name="app.nightly", last_tick=func.now()))
    return ids


@pytest.fixture
def client(engine: sa.Engine) -> Iterator[TestClient]:
    with TestClient(create_app(engine, allow_actions=True), base_url=LOCAL) as client:
        yield client


@pytest.fixture
def read_only_client(engine: sa.Engine) -> Iterator[TestClient]:
    with TestClient(create_app(engine), base_url=LOCAL) as client:
        yield client


def test_every_page_renders_the_database(client: TestClient, jobs: dict[str, int]) -> None:
    overview = client.get("/")
    assert overview.status_code == 200
    for shown in ("emails", "reports", "host-a:4242:0badcafe", "schema", "dead_jobs"):
        assert shown in overview.text
    assert "actions on" in overview.text

    everything = client.get("/jobs")
    assert all(f'href="/jobs/{i}"' in everything.text for i in jobs.values())

    dead = client.get("/jobs", params={"status": "dead"})
    assert f'href="/jobs/{jobs["dead"]}"' in dead.text
    assert f'href="/jobs/{jobs["queued"]}"' not in dead.text
    assert "Retry all matching" in dead.text

    job = client.get(f"/jobs/{jobs['dead']}")
    assert job.status_code == 200
    assert "bad input" in job.text  # the last error
    assert "attempt 3 started" in job.text  # the timeline
    payload = client.get(f"/jobs/{jobs['dead']}/payload.json")
    assert payload.headers["content-type"] == "application/json"
    assert payload.json() == {"n": 1}

    assert "app.nightly" in client.get("/periodic").text
    purge = client.get("/purge", params={"status": "dead", "older_than": "0"})
    assert "<strong>2</strong> job(s) match now" in purge.text
    assert client.get("/static/dashboard.js").status_code == 200


@pytest.mark.parametrize(
    ("path", "status", "says"),
    [
        ("/jobs/0", 404, "no job with id 0"),
        ("/jobs/0/payload.json", 404, "no job with id 0"),
        (f"/jobs/{2**63}", 404, f"no job with id {2**63}"),  # past bigint: not a database error
        ("/jobs?status=finished", 400, "unknown status"),
        ("/jobs?older_than=soon", 400, "not a duration"),
        ("/purge?status=queued&older_than=1d", 400, "only finished jobs"),
        ("/purge?status=dead", 400, "give the age"),
    ],
)
def test_what_cannot_be_shown_says_why(
    read_only_client: TestClient, path: str, status: int, says: str
) -> None:
    response = read_only_client.get(path)
    assert response.status_code == status
    assert says in response.text
    assert "Traceback" not in response.text


def test_retry_a_dead_job_from_its_page(
    engine: sa.Engine, client: TestClient, jobs: dict[str, int]
) -> None:
    page = client.get(f"/jobs/{jobs['dead']}").text
    form = post_form(page, f"/jobs/{jobs['dead']}/retry")

    done = client.post(form.action, data=form.fields, follow_redirects=False)

    assert done.status_code == 303
    assert done.headers["location"] == f"/jobs/{jobs['dead']}"
    assert status_of(engine, jobs["dead"]) == "queued"
    shown = client.get(done.headers["location"]).text
    assert f"job {jobs['dead']} is queued again" in shown
    assert "status-queued" in shown
    assert "is queued again" not in client.get("/").text  # the message is shown once


def test_cancel_from_a_job_page(
    engine: sa.Engine, client: TestClient, jobs: dict[str, int]
) -> None:
    form = post_form(client.get(f"/jobs/{jobs['scheduled']}").text, "/cancel")
    shown = client.post(form.action, data=form.fields).text
    assert f"job {jobs['scheduled']} is cancelled" in shown
    assert status_of(engine, jobs["scheduled"]) == "cancelled"
    running = post_form(client.get(f"/jobs/{jobs['running']}").text, "/cancel")
    assert "cancellation requested" in client.post(running.action, data=running.fields).text


def test_retry_every_dead_job_of_a_filter(
    engine: sa.Engine, client: TestClient, jobs: dict[str, int]
) -> None:
    listing = client.get("/jobs", params={"status": "dead", "queue": "reports"}).text
    form = post_form(listing, "/jobs/retry")
    assert form.fields["queue"] == "reports"

    shown = client.post(form.action, data=form.fields).text

    assert "1 dead job(s) queued again" in shown
    assert status_of(engine, jobs["dead2"]) == "queued"
    assert status_of(engine, jobs["dead"]) == "dead"  # another queue's


def test_retry_every_dead_job_with_no_filter(
    engine: sa.Engine, client: TestClient, jobs: dict[str, int]
) -> None:
    listing = client.get("/jobs", params={"status": "dead"}).text
    form = post_form(listing, "/jobs/retry")
    assert form.fields["queue"] == ""

    shown = client.post(form.action, data=form.fields).text

    assert "2 dead job(s) queued again" in shown
    assert "nothing changed" not in shown
    assert status_of(engine, jobs["dead"]) == "queued"
    assert status_of(engine, jobs["dead2"]) == "queued"


def test_purge_counts_first_then_deletes(
    engine: sa.Engine, client: TestClient, jobs: dict[str, int]
) -> None:
    preview = client.get("/purge", params={"status": ["dead", "succeeded"], "older_than": "10s"})
    assert "<strong>2</strong> job(s) match now" in preview.text  # dead2 died just now
    form = post_form(preview.text, "/purge")

    shown = client.post(form.action, data=form.fields).text

    assert "purged 2 dead/succeeded job(s) finished over 10s ago" in shown
    assert "<strong>0</strong> job(s) match now" in shown
    with engine.connect() as conn:
        left = set(conn.execute(select(j.id)).scalars())
    assert left == {jobs[k] for k in ("queued", "scheduled", "running", "dead2")}


def test_the_age_fields_show_an_example_not_a_seeming_default(client: TestClient) -> None:
    for path, example in [
        ("/purge", "an age, required: for example 7d, 12h or 30m"),
        ("/jobs", "for example 2h or 1d; empty: any age"),
    ]:
        html = client.get(path).text
        assert "placeholder" not in html, path
        assert example in html, path
        (form,) = [f for f in forms(html, "get") if f.action == path]
        assert form.fields["older_than"] == ""  # nothing is filled in for you


def test_the_overview_links_to_its_next_page_of_queues(
    read_only_client: TestClient, jobs: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_reads, "QUEUES_SHOWN", 1)
    first = read_only_client.get("/").text
    assert "2 queues, 1 on this page (emails to emails)" in first
    (more,) = [link for link in links(first) if "queues_after=" in link]
    second = read_only_client.get(more).text
    assert 'href="/jobs?queue=reports"' in second
    assert 'href="/jobs?queue=emails"' not in second
    assert not [link for link in links(second) if "queues_after=" in link]
    refused = read_only_client.get("/", params={"queues_after": "q" * 65})
    assert refused.status_code == 400


def test_pause_and_resume_a_queue_from_the_overview(
    engine: sa.Engine, client: TestClient, read_only_client: TestClient, jobs: dict[str, int]
) -> None:
    overview = client.get("/").text
    pauses = [f for f in forms(overview) if f.action == "/queues/pause"]
    assert sorted(f.fields["queue"] for f in pauses) == ["emails", "reports"]
    (emails,) = [f for f in pauses if f.fields["queue"] == "emails"]

    shown = client.post(emails.action, data=emails.fields).text

    assert "queue emails is paused" in shown
    with engine.connect() as conn:
        assert list(paused_queues(conn)) == ["emails"]
    assert "status-paused" in read_only_client.get("/").text  # the state, without buttons
    resume = post_form(shown, "/queues/resume")
    assert resume.fields["queue"] == "emails"
    assert "queue emails is resumed" in client.post(resume.action, data=resume.fields).text
    with engine.connect() as conn:
        assert list(paused_queues(conn)) == []
    bad = client.post(emails.action, data={**emails.fields, "queue": "no such/queue"}).text
    assert "nothing changed: invalid queue name" in bad


def test_the_overview_shows_each_queues_limits(
    engine: sa.Engine, read_only_client: TestClient, jobs: dict[str, int]
) -> None:
    with engine.begin() as conn:
        set_queue_concurrency(conn, "emails", 3)
        set_queue_rate(conn, "emails", "50/s")
        set_queue_rate(conn, "webhooks", "10/5m")  # limited, with no job yet
    cells = {
        queue: re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html)).strip()
        for queue, html in re.findall(
            r'<a href="/jobs\?queue=(\w+)">.*?<td class="queue-limits">(.*?)</td>',
            read_only_client.get("/").text,
            flags=re.S,
        )
    }
    assert cells == {
        "emails": "at most 3 running, 50/1s (used 0)",
        "reports": "none",
        "webhooks": "10/5m (used 0)",
    }


def test_the_overview_shows_limits_per_key(
    engine: sa.Engine, read_only_client: TestClient, jobs: dict[str, int]
) -> None:
    with engine.begin() as conn:
        set_queue_key_concurrency(conn, "emails", 1, key="customer_id")
        set_queue_concurrency(conn, "reports", 2)
        set_queue_key_rate(conn, "reports", "10/s", key="tenant")
    assert limit_cells(read_only_client.get("/").text) == {
        "emails": "at most 1 per customer_id",
        "reports": "at most 2 running, 10/1s per tenant",
    }


def limit_cells(html: str) -> dict[str, str]:
    return {
        queue: re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", cell)).strip()
        for queue, cell in re.findall(
            r'<a href="/jobs\?queue=(\w+)">.*?<td class="queue-limits">(.*?)</td>',
            html,
            flags=re.S,
        )
    }


def cell_text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html)).strip()


def queue_table(html: str) -> dict[str, dict[str, str]]:
    """The overview's queues table: each queue's row, its cells' text by column heading."""
    table = html.split('<table class="queues">')[1].split("</table>")[0]
    heads = [cell_text(h) for h in re.findall(r"<th[^>]*>(.*?)</th>", table, flags=re.S)]
    rows = [
        [cell_text(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", tr, flags=re.S)]
        for tr in re.findall(r"<tr>(.*?)</tr>", table, flags=re.S)
    ]
    # The first cell: the queue's name, then the link to its page ("settings").
    return {cells[0].split()[0]: dict(zip(heads, cells, strict=True)) for cells in rows if cells}


def test_the_overview_counts_jobs_waiting_for_dependencies(
    engine: sa.Engine, read_only_client: TestClient, jobs: dict[str, int]
) -> None:
    with engine.begin() as conn:
        waiting = [add_job(conn, queue="reports", status="waiting") for _ in range(2)]
        conn.execute(
            sa.insert(dependencies_table),
            [
                {"job_id": w, "depends_on": jobs["queued"], "on_failure": "cancel", "pending": True}
                for w in waiting
            ],
        )
    table = queue_table(read_only_client.get("/").text)
    assert table["reports"]["Waiting"] == "2"
    assert table["emails"]["Waiting"] == "0"
    # The link under the count lists them.
    listed = read_only_client.get("/jobs", params={"queue": "reports", "status": "waiting"}).text
    assert all(f'href="/jobs/{w}"' in listed for w in waiting)


def test_without_actions_no_button_and_every_action_refused(
    engine: sa.Engine, client: TestClient, read_only_client: TestClient, jobs: dict[str, int]
) -> None:
    pages = ["/", "/jobs?status=dead", f"/jobs/{jobs['dead']}", f"/jobs/{jobs['queued']}"]
    pages.append("/purge?status=dead&older_than=0")
    for path in pages:
        html = read_only_client.get(path).text
        assert forms(html) == [], path
        assert "read-only" in html
    # Forms (with valid tokens) from an app that allows actions, sent to one that does not.
    retry = post_form(client.get(f"/jobs/{jobs['dead']}").text, "/retry")
    actions = [retry.action, f"/jobs/{jobs['queued']}/cancel", "/jobs/retry", "/purge"]
    for action in (*actions, "/queues/pause", "/queues/resume"):
        fields = {**retry.fields, "older_than": "0", "queue": "emails"}
        response = read_only_client.post(action, data=fields)
        assert response.status_code == 403
        assert "actions are off" in response.text
    assert status_of(engine, jobs["dead"]) == "dead"
    assert status_of(engine, jobs["queued"]) == "queued"
    with engine.connect() as conn:
        assert list(paused_queues(conn)) == []


def test_a_post_without_the_right_token_changes_nothing(
    engine: sa.Engine, client: TestClient, jobs: dict[str, int]
) -> None:
    form = post_form(client.get(f"/jobs/{jobs['dead']}").text, "/retry")
    for fields in ({}, {CSRF_FIELD: "forged.token"}, {CSRF_FIELD: form.fields[CSRF_FIELD] + "x"}):
        response = client.post(form.action, data=fields)
        assert response.status_code == 403
        assert "security token" in response.text
    client.cookies.clear()  # the form's token without the browser's cookie
    assert client.post(form.action, data=form.fields).status_code == 403
    assert status_of(engine, jobs["dead"]) == "dead"


# -- hostile rows --------------------------------------------------------------------------------

SCRIPT = "<script>alert(1)</script>"
HTML_ERROR = '<img src=x onerror="alert(2)">'
CONTROLS = "bell\x07 escape\x1b[31m del\x7f rtl\u202e"


def nested(depth: int) -> str:
    return '{"a": ' * depth + f"{json.dumps(SCRIPT)}" + "}" * depth


@pytest.fixture
def hostile(engine: sa.Engine) -> dict[str, int]:
    """Rows written by something other than enqueue: markup, control characters, a megabyte."""
    rows = {
        "markup": {
            "queue": SCRIPT,
            "task": f"task{SCRIPT}",
            "payload": {"html": SCRIPT, "controls": CONTROLS},
            "last_error": {
                "type": SCRIPT,
                "message": f"{HTML_ERROR}\n{CONTROLS}",
                "traceback": SCRIPT,
            },
            "unique_key": SCRIPT,
        },
        "huge": {"queue": "q", "task": "huge", "payload": {"blob": "<b>" * 350_000}},
        "odd_error": {"queue": "q", "task": "odd", "payload": [], "last_error": SCRIPT},
    }
    ids: dict[str, int] = {}
    with engine.begin() as conn:
        for name, values in rows.items():
            ids[name] = add_dead(conn, **values)
        ids["deep"] = conn.execute(
            sa.insert(jobs_table)
            .values(
                queue="q",
                task="deep",
                payload=sa.cast(sa.literal(nested(2000), sa.Text), JSONB),
                status="dead",
                attempts=1,
                max_attempts=1,
                finished_at=func.now(),
            )
            .returning(j.id)
        ).scalar_one()
        conn.execute(
            sa.insert(workers_table).values(
                name=SCRIPT, host=CONTROLS, pid=1, queues=[SCRIPT], concurrency=1
            )
        )
        conn.execute(sa.insert(periodic_table).values(name=SCRIPT, last_tick=func.now()))
    return ids


def assert_escaped(html: str) -> None:
    assert "<script>alert" not in html
    assert "<img src=x" not in html
    assert "<b><b>" not in html
    for char in "\x07\x1b\x7f\u202e":
        assert char not in html


def test_hostile_rows_render_escaped(read_only_client: TestClient, hostile: dict[str, int]) -> None:
    paths = ["/", "/jobs", "/jobs?status=dead", "/periodic", f"/jobs/{hostile['markup']}"]
    paths += [f"/jobs/{hostile[k]}" for k in ("huge", "odd_error", "deep")]
    for path in paths:
        response = read_only_client.get(path)
        assert response.status_code == 200, path
        assert_escaped(response.text)

    markup = read_only_client.get(f"/jobs/{hostile['markup']}").text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in markup
    assert "&lt;img src=x onerror=&#34;alert(2)&#34;&gt;" in markup
    assert "bell\\x07 escape\\x1b[31m del\\x7f rtl\\u202e" in markup  # the error's message

    huge = read_only_client.get(f"/jobs/{hostile['huge']}").text
    assert "Showing the first 65,536 of 1,050,012 characters" in huge
    assert len(huge) < 500_000  # 65,536 characters, escaped

    deep = read_only_client.get(f"/jobs/{hostile['deep']}").text
    assert deep.count("{&#34;a&#34;: ") == 2000  # as the database wrote it, not re-indented


# -- mounted in another application --------------------------------------------------------------


def test_mounted_under_a_prefix_every_link_stays_under_it(
    engine: sa.Engine, jobs: dict[str, int]
) -> None:
    app = FastAPI()

    @app.get("/")
    def home() -> dict[str, str]:
        return {"app": "the host application's own"}

    app.mount("/jobs", create_app(engine, allow_actions=True))
    seen: set[str] = set()
    with TestClient(app, base_url=LOCAL) as client:
        assert client.get("/").json() == {"app": "the host application's own"}
        queue = ["/jobs/"]
        while queue:
            path = queue.pop()
            if path in seen:
                continue
            seen.add(path)
            response = client.get(path)
            assert response.status_code == 200, path
            if not response.headers["content-type"].startswith("text/html"):
                continue
            for link in links(response.text):
                assert link.startswith("/jobs/"), f"{path} links to {link}"
            queue += links(response.text, posts=False)
        # An action's redirect, too, comes back under the prefix.
        form = post_form(client.get(f"/jobs/jobs/{jobs['dead']}").text, "/retry")
        done = client.post(form.action, data=form.fields, follow_redirects=False)
        assert done.headers["location"] == f"/jobs/jobs/{jobs['dead']}"
    assert f"/jobs/jobs/{jobs['dead']}" in seen
    assert any(p.startswith("/jobs/static/") for p in seen)
    assert len(seen) > 15


# -- a role that may only read ---------------------------------------------------------------


def documented_grants() -> str:
    """The GRANT statement the how-to page gives for a read-only role."""
    page = DOCS_PAGE.read_text()
    found = re.search(r"<!-- read-only grants -->\n```sql\n(.*?)\n```", page, flags=re.S)
    assert found, f"{DOCS_PAGE} shows the read-only grants after <!-- read-only grants -->"
    return found[1]


@pytest.fixture
def reader_url(database_url: URL) -> Iterator[URL]:
    """A role with only the documented grants, on the test's database."""
    role = unique_name("sajq_reader_")
    grants = documented_grants().replace("dashboard_reader", role)
    admin = admin_engine(database_url)
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE ROLE {role} LOGIN")
        conn.exec_driver_sql(grants)
    try:
        yield database_url.set(username=role, password=None)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP OWNED BY {role}")
            conn.exec_driver_sql(f"DROP ROLE {role}")
        admin.dispose()


def test_a_role_with_select_only_renders_every_page(
    engine: sa.Engine, reader_url: URL, jobs: dict[str, int]
) -> None:
    reader = create_engine(reader_url)
    try:
        with TestClient(create_app(reader, allow_actions=True), base_url=LOCAL) as client:
            for path in (
                "/",
                "/jobs",
                "/jobs?status=dead&queue=emails",
                f"/jobs/{jobs['dead']}",
                f"/jobs/{jobs['dead']}/payload.json",
                f"/jobs/{jobs['dead']}/workflow",
                "/queues?name=emails",
                "/periodic",
                "/purge?status=dead&older_than=0",
            ):
                assert client.get(path).status_code == 200, path
            form = post_form(client.get(f"/jobs/{jobs['dead']}").text, "/retry")
            refused = client.post(form.action, data=form.fields).text
    finally:
        reader.dispose()
    assert "nothing changed: the database refused: permission denied" in refused
    assert "this role may only read" in refused
    assert status_of(engine, jobs["dead"]) == "dead"


def test_a_database_without_the_schema_says_what_to_run(empty_database_url: URL) -> None:
    engine = create_engine(empty_database_url)
    try:
        with TestClient(create_app(engine), base_url=LOCAL) as client:
            response = client.get("/")
    finally:
        engine.dispose()
    assert response.status_code == 503
    assert "sa-jobqueue migrate" in response.text


# -- sa-jobqueue web -----------------------------------------------------------------------------


def fetch(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_web_command_asks_for_its_token_and_stops_on_sigterm(
    database_url: URL, tmp_path: Path, jobs: dict[str, int]
) -> None:
    err = tmp_path / "web.err"
    env = {**subprocess_env(), "SA_JOBQUEUE_WEB_TOKEN": "s3cret"}
    with err.open("w") as stderr:
        proc = subprocess.Popen(
            [
                *CLI,
                "web",
                "--database-url",
                url_string(database_url),
                "--port",
                "0",
                "--app",
                "tests.apps.periodic:queue",
            ],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        found = wait_for(
            lambda: re.search(
                r"http://127\.0\.0\.1:(\d+)/ \(read-only, credentials", err.read_text()
            ),
            timeout=30,
        )
        base = f"http://127.0.0.1:{found[1]}"
        assert fetch(base + "/")[0] == 401
        status, refused = fetch(base + "/api/v1/jobs")  # the API says it in JSON
        assert status == 401
        assert json.loads(refused)["error"]["type"] == "not_authenticated"
        assert fetch(base + "/api/v1/jobs", {"authorization": "Bearer s3cret"})[0] == 200
        status, html = fetch(base + "/jobs?status=dead", {"authorization": "Bearer s3cret"})
        assert status == 200
        assert f'href="/jobs/{jobs["dead"]}"' in html
        schedules = fetch(base + "/periodic", {"authorization": "Bearer s3cret"})[1]
        assert "<code>* * * * *</code>" in schedules  # the app's declarations, from --app
        assert "Europe/Paris" in schedules
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in err.read_text()


def test_the_web_command_refuses_a_port_in_use(database_url: URL) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = subprocess.run(
            [*CLI, "web", "--database-url", url_string(database_url), "--port", str(port)],
            cwd=REPO_ROOT,
            env=subprocess_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"sa-jobqueue: cannot listen on 127.0.0.1:{port}: [Errno 98] Address already in use"
    ]


@contextmanager
def web_command(database_url: URL, err: Path, *options: str) -> Iterator[int]:
    """``sa-jobqueue web --port 0 OPTIONS`` running; yields its port, stops it with SIGTERM."""
    with err.open("w") as stderr:
        proc = subprocess.Popen(
            [*CLI, "web", "--database-url", url_string(database_url), "--port", "0", *options],
            cwd=REPO_ROOT,
            env=subprocess_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        found = wait_for(
            lambda: re.search(r"http://127\.0\.0\.1:(\d+)/ ", err.read_text()), timeout=30
        )
        yield int(found[1])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in err.read_text()


def test_the_web_command_answers_only_its_own_host_names(
    engine: sa.Engine, database_url: URL, tmp_path: Path, jobs: dict[str, int]
) -> None:
    """DNS rebinding: a page of evil.example whose name now resolves to 127.0.0.1 reaches the
    dashboard with ``Host: evil.example``; its forms post with ``Origin: http://evil.example``."""
    options = ("--allow-actions", "--allowed-host", "dash.example")
    options += ("--trusted-origin", "https://proxy.example")
    with web_command(database_url, tmp_path / "web.err", *options) as port:
        evil = f"evil.example:{port}"
        payload = f"/jobs/{jobs['dead']}/payload.json"
        with httpx2.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            for path in (payload, f"/jobs/{jobs['dead']}", "/"):
                refused = client.get(path, headers={"host": evil})
                assert refused.status_code == 400, path
                assert '"n"' not in refused.text
            assert client.get(payload).json() == {"n": 1}  # Host: 127.0.0.1:PORT
            assert client.get(payload, headers={"host": f"localhost:{port}"}).status_code == 200
            assert client.get(payload, headers={"host": f"dash.example:{port}"}).status_code == 200

            pauses = {f.fields["queue"]: f for f in forms(client.get("/").text)}
            emails = pauses["emails"]
            assert emails.action == "/queues/pause"
            for headers in (
                {"origin": f"http://{evil}"},
                {"origin": f"http://{evil}", "host": evil},
                {"origin": "null"},
                {"origin": f"https://127.0.0.1:{port}.evil.example"},
            ):
                refused = client.post(emails.action, data=emails.fields, headers=headers)
                assert refused.status_code in (400, 403), headers
            with engine.connect() as conn:
                assert list(paused_queues(conn)) == []

            # The same form, from the dashboard's own page and from the trusted origin.
            own = {"origin": f"http://127.0.0.1:{port}"}
            done = client.post(emails.action, data=emails.fields, headers=own)
            assert done.status_code == 303
            reports = pauses["reports"]
            trusted = {"origin": "https://proxy.example", "host": f"dash.example:{port}"}
            done = client.post(reports.action, data=reports.fields, headers=trusted)
            assert done.status_code == 303
            with engine.connect() as conn:
                assert sorted(paused_queues(conn)) == ["emails", "reports"]


def test_the_web_command_refuses_a_malformed_host_or_origin(database_url: URL) -> None:
    for option, value, says in [
        ("--allowed-host", "dash.example:8080", "allowed host dash.example:8080: a host name"),
        ("--trusted-origin", "dash.example", "trusted origin dash.example: scheme://host[:port]"),
    ]:
        result = subprocess.run(
            [*CLI, "web", "--database-url", url_string(database_url), option, value],
            cwd=REPO_ROOT,
            env=subprocess_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 1
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(f"sa-jobqueue: {says}")
