"""The queue page: its state, limits and workers; with actions on, pause and resume and every
limit changed there through the functions ``sa-jobqueue queues`` uses, over HTTP. The overview
says what holds each queue back."""

from __future__ import annotations

import re
from collections.abc import Iterator
from html import unescape

import pytest
import sqlalchemy as sa
from starlette.testclient import TestClient

from sa_jobqueue.ops import paused_queues, queue_limits, set_queue_concurrency
from sa_jobqueue.ops.queues import QueueLimits, RateLimit, pause_queue, set_queue_rate
from sa_jobqueue.web import create_app
from tests.helpers.job_states import add_job
from tests.helpers.pages import LOCAL, forms, post_form


@pytest.fixture
def client(engine: sa.Engine) -> Iterator[TestClient]:
    with TestClient(create_app(engine, allow_actions=True), base_url=LOCAL) as client:
        yield client


@pytest.fixture
def read_only_client(engine: sa.Engine) -> Iterator[TestClient]:
    with TestClient(create_app(engine), base_url=LOCAL) as client:
        yield client


def text_of(html: str) -> str:
    return unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).strip())


def field(html: str, name: str) -> str:
    """The text of the queue page's ``<dd id=name>``."""
    return text_of(html.split(f'<dd id="{name}">')[1].split("</dd>")[0])


def limits_of(engine: sa.Engine, queue: str) -> QueueLimits:
    with engine.connect() as conn:
        return queue_limits(conn).get(queue, QueueLimits())


def test_pause_and_resume_from_the_queue_page(engine: sa.Engine, client: TestClient) -> None:
    page = client.get("/queues?name=emails").text
    assert field(page, "queue-state") == "running"
    pause = post_form(page, "/queues/pause")

    shown = client.post(pause.action, data=pause.fields)

    assert shown.url.path == "/queues"  # back on the queue's own page
    assert "queue emails is paused" in shown.text
    assert field(shown.text, "queue-state").startswith("paused")
    assert "paused" in field(shown.text, "queue-held")
    with engine.connect() as conn:
        assert list(paused_queues(conn)) == ["emails"]
    resume = post_form(shown.text, "/queues/resume")
    assert "queue emails is resumed" in client.post(resume.action, data=resume.fields).text
    with engine.connect() as conn:
        assert list(paused_queues(conn)) == []


def test_every_limit_set_and_removed_from_the_queue_page(
    engine: sa.Engine, client: TestClient
) -> None:
    form = post_form(client.get("/queues?name=emails").text, "/queues/limits")
    assert {form.fields[k] for k in ("concurrency", "rate", "key_field")} == {""}
    values = {
        "concurrency": "3",
        "rate": "50/s",
        "key_field": "customer_id",
        "key_concurrency": "1",
        "key_rate": "10/5m",
    }
    shown = client.post(form.action, data={**form.fields, **values}).text
    assert (
        "queue emails: at most 3 running, 50/1s, at most 1 per customer_id, 10/5m per"
        " customer_id (was: no limit)"
    ) in text_of(shown)
    assert limits_of(engine, "emails") == QueueLimits(
        3, RateLimit.parse("50/s"), 1, "customer_id", RateLimit.parse("10/5m")
    )
    assert field(shown, "limit-key-cap") == "at most 1 per customer_id"
    # The form shows the limits in force: sent back with another key field, it moves both.
    again = post_form(shown, "/queues/limits")
    assert again.fields["concurrency"] == "3"
    assert again.fields["key_rate"] == "10/5m"
    client.post(again.action, data={**again.fields, "key_field": "tenant", "rate": ""})
    assert limits_of(engine, "emails") == QueueLimits(
        3, None, 1, "tenant", RateLimit.parse("10/5m")
    )
    blank = {k: "" for k in values}
    client.post(again.action, data={**again.fields, **blank})
    assert limits_of(engine, "emails") == QueueLimits()


@pytest.mark.parametrize(
    ("values", "said"),
    [
        ({"concurrency": "0"}, "a cap must be from 1 to"),
        ({"concurrency": "three"}, "a cap must be a whole number, not 'three'"),
        ({"rate": "fast"}, "not a rate: 'fast'"),
        ({"key_concurrency": "2"}, "a limit per key needs the payload field of the key"),
        ({"key_rate": "1/s", "key_field": "x" * 201}, "a limit per key needs the payload field"),
        ({"queue": "no such/queue"}, "invalid queue name"),
    ],
)
def test_an_invalid_limit_is_said_and_nothing_changes(
    engine: sa.Engine, client: TestClient, values: dict[str, str], said: str
) -> None:
    with engine.begin() as conn:
        set_queue_concurrency(conn, "emails", 2)
    form = post_form(client.get("/queues?name=emails").text, "/queues/limits")
    response = client.post(form.action, data={**form.fields, "concurrency": "5", **values})
    assert response.status_code == 200
    assert 'class="flash failed"' in response.text
    assert f"nothing changed: {said}" in text_of(response.text)
    assert "Traceback" not in response.text
    assert limits_of(engine, "emails") == QueueLimits(concurrency=2)


def test_read_only_the_queue_page_has_no_form_and_its_posts_are_refused(
    engine: sa.Engine, client: TestClient, read_only_client: TestClient
) -> None:
    page = read_only_client.get("/queues?name=emails").text
    assert forms(page) == []
    assert field(page, "limit-cap") == "none"
    form = post_form(client.get("/queues?name=emails").text, "/queues/limits")
    response = read_only_client.post(form.action, data={**form.fields, "concurrency": "4"})
    assert response.status_code == 403
    assert "actions are off" in response.text
    assert limits_of(engine, "emails") == QueueLimits()


def test_a_post_from_another_site_is_refused(engine: sa.Engine, client: TestClient) -> None:
    form = post_form(client.get("/queues?name=emails").text, "/queues/limits")
    other = {"origin": "https://evil.example"}
    response = client.post(form.action, data={**form.fields, "concurrency": "4"}, headers=other)
    assert response.status_code == 403
    no_token = client.post(form.action, data={"queue": "emails", "concurrency": "4"})
    assert no_token.status_code == 403
    assert limits_of(engine, "emails") == QueueLimits()


def test_a_bad_queue_name_in_the_address_is_a_400(read_only_client: TestClient) -> None:
    # Any name of 1 to 64 characters is shown (rows may be written some other way); the
    # settings' forms then refuse one enqueue would refuse.
    assert read_only_client.get("/queues?name=" + "x" * 65).status_code == 400
    assert read_only_client.get("/queues").status_code == 400


def held_back(html: str) -> dict[str, str]:
    return {
        name: text_of(cell)
        for name, cell in re.findall(
            r'<a href="/jobs\?queue=(\w+)">.*?<td class="queue-held">(.*?)</td>', html, flags=re.S
        )
    }


def test_the_overview_says_what_holds_each_queue_back(
    engine: sa.Engine, read_only_client: TestClient
) -> None:
    with engine.begin() as conn:
        for queue in ("paused", "capped", "limited", "unserved", "free"):
            add_job(conn, queue=queue, task="app.t", visible_in=-5)
        add_job(conn, queue="capped", status="running", attempts=1, started_ago=1, visible_in=30)
        pause_queue(conn, "paused")
        set_queue_concurrency(conn, "capped", 1)
        set_queue_rate(conn, "limited", "1/h")
        conn.execute(
            sa.text(
                "UPDATE sa_jobqueue_queues SET rate_count = 1,"
                " rate_window = date_bin('1 hour', now(), 'epoch')"
                " WHERE queue = 'limited'"
            )
        )
        conn.execute(
            sa.text(
                "INSERT INTO sa_jobqueue_workers (name, host, pid, queues, concurrency)"
                " VALUES ('w', 'h', 1, ARRAY['paused', 'capped', 'limited', 'free'], 4)"
            )
        )
    assert held_back(read_only_client.get("/").text) == {
        "capped": "at cap",
        "free": "-",
        "limited": "rate limit",
        "paused": "paused",
        "unserved": "no worker",
    }
