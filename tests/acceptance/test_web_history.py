"""The dashboard's long history and payload search, over HTTP with committed rows.

The overview and a queue's page show the last 24 hours and 7 days from the hourly history
(drawn as SVG on the server: no script needed); the jobs list finds jobs by what their payload
contains, a window of ids a page, and says so; the list's rows sit in the part the live
refresh replaces.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from starlette.testclient import TestClient

from sa_jobqueue.web import create_app
from tests.helpers.job_states import add_job
from tests.helpers.pages import LOCAL, post_form

HOURS = sa.text(
    """
INSERT INTO sa_jobqueue_history (queue, hour, succeeded, dead, cancelled)
SELECT 'emails', date_trunc('hour', now()) - make_interval(hours => h), 10, h % 2, 0
FROM generate_series(0, :hours - 1) AS h
"""
)


@pytest.fixture
def client(engine: sa.Engine) -> Iterator[TestClient]:
    with TestClient(create_app(engine, allow_actions=True), base_url=LOCAL) as client:
        yield client


def test_the_overview_and_the_queue_page_show_a_day_and_a_week(
    engine: sa.Engine, client: TestClient
) -> None:
    with engine.begin() as conn:
        add_job(conn, queue="emails", visible_in=600)
        # A fortnight of hours: the week's sums stop at 168 of them, the day's at 24.
        conn.execute(HOURS, {"hours": 24 * 14})
    page = client.get("/").text
    row = re.search(r"<tr>\s*<td><a href=\"/jobs\?queue=emails\">.*?</tr>", page, re.S)
    assert row is not None
    day, week = re.findall(r'<td class="n history" title="([^"]*)"', row.group(0))
    assert day == "240 succeeded, 12 dead, 0 cancelled"
    assert week == "1680 succeeded, 84 dead, 0 cancelled"
    assert "+84 dead" in row.group(0)

    queue = client.get("/queues", params={"name": "emails"}).text
    assert "Last 24 hours: 240 succeeded, 12 dead, 0 cancelled" in queue
    assert "Last 7 days: 1,680 succeeded, 84 dead, 0 cancelled" in queue
    charts = re.findall(r'<svg class="chart wide" viewBox="0 0 (\d+) 32".*?</svg>', queue, re.S)
    assert charts == ["96", "672"]
    bars = re.findall(r"<title>(\d+) (\w+), ([^<]*)</title>", queue)
    assert ("10", "succeeded", "this hour") in bars
    assert ("1", "dead", "167 h before this hour") in bars
    assert len([b for b in bars if b[1] == "succeeded"]) == 24 + 168
    # A queue without history: empty charts.
    queue = client.get("/queues", params={"name": "quiet"}).text
    assert "Last 7 days: 0 succeeded, 0 dead, 0 cancelled" in queue
    assert "<rect" not in queue.split('id="history"')[1].split("</section>")[0]


def test_search_the_jobs_by_what_their_payload_contains(
    engine: sa.Engine, client: TestClient
) -> None:
    with engine.begin() as conn:
        found = [add_job(conn, payload={"customer": 42, "n": n}) for n in range(3)]
        add_job(conn, payload={"customer": 43, "n": 0})
        add_job(conn, payload=[1, 2])
        nested = add_job(conn, payload={"order": {"customer": 42, "lines": [1, 2, 3]}})
    listed = client.get("/jobs", params={"payload": '{"customer": 42}'})
    assert listed.status_code == 200
    ids = {int(i) for i in re.findall(r'name="id" value="(\d+)"', listed.text)}
    assert ids == set(found)
    assert "with payload containing {&#34;customer&#34;: 42}" in listed.text
    assert "each page reads the payloads of up to 50,000 jobs" in listed.text
    # Containment: nested objects and arrays match a part of them.
    deep = client.get("/jobs", params={"payload": '{"order": {"lines": [2]}}'}).text
    assert {int(i) for i in re.findall(r'name="id" value="(\d+)"', deep)} == {nested}
    # The form keeps it, and the pager's links carry it on.
    assert 'value="{&#34;customer&#34;: 42}"' in listed.text
    # The list's rows are in the part the live refresh replaces, under its pause control.
    assert '<input type="checkbox" id="auto-refresh">' in listed.text
    assert listed.text.index('<div id="live">') < listed.text.index('<form id="bulk"')
    # One script, from the dashboard itself: the CSP forbids any other, inline ones too.
    (script,) = re.findall(r"<script[^>]*>", listed.text)
    assert re.fullmatch(r'<script src="/static/dashboard\.js\?v=[^"]+" defer>', script)
    for search, said in MALFORMED:
        answer = client.get("/jobs", params={"payload": search})
        assert answer.status_code == 400
        assert said in answer.text
        assert "Traceback" not in answer.text


MALFORMED = [
    ("customer=42", "a payload search is JSON"),
    ("42", "a payload search is a JSON object or array"),
    ('"text"', "a payload search is a JSON object or array"),
    ("{" + '"a": 1, ' * 400 + '"b": 2}', "at most 2,000 characters"),
]


def test_a_payload_search_acts_on_the_page_not_on_all_matching(
    engine: sa.Engine, client: TestClient
) -> None:
    with engine.begin() as conn:
        found = add_job(conn, payload={"customer": 42}, visible_in=600)
        other = add_job(conn, payload={"customer": 43}, visible_in=600)
    listed = client.get("/jobs", params={"payload": '{"customer": 42}'}).text
    assert 'value="all"' not in listed  # no "all matching" choice
    form = post_form(listed, "/jobs/bulk")
    fields = dict(form.fields)
    fields.update(action="cancel", scope="all")
    refused = client.post("/jobs/bulk", data=fields)
    assert refused.status_code == 400
    assert "acts on the ticked rows or the page" in refused.text
    fields.update(scope="page", confirmed="yes")
    client.post("/jobs/bulk", data={**fields, "page_id": [str(found)]})
    with engine.connect() as conn:
        statuses = dict(conn.execute(sa.text("SELECT id, status FROM sa_jobqueue_jobs")).all())
    assert statuses == {found: "cancelled", other: "queued"}
