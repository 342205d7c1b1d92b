"""The jobs list's "act on many" over HTTP: chosen rows or a whole filter, through the
confirmation page, against PostgreSQL with committed rows; and every refusal.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy import select
from starlette.testclient import TestClient

from sa_jobqueue.models import jobs_table
from sa_jobqueue.web import create_app
from sa_jobqueue.web._tokens import CSRF_FIELD
from tests.helpers.job_states import add_dead, add_job
from tests.helpers.pages import LOCAL, Form, forms, post_form

j = jobs_table.c


@pytest.fixture
def client(engine: sa.Engine) -> Iterator[TestClient]:
    with TestClient(create_app(engine, allow_actions=True), base_url=LOCAL) as client:
        yield client


@pytest.fixture
def read_only_client(engine: sa.Engine) -> Iterator[TestClient]:
    with TestClient(create_app(engine), base_url=LOCAL) as client:
        yield client


@pytest.fixture
def jobs(engine: sa.Engine) -> dict[str, int]:
    with engine.begin() as conn:
        return {
            "queued": add_job(conn, queue="mails", task="app.send", visible_in=-5),
            "later": add_job(conn, queue="mails", task="app.send", visible_in=3600),
            "waiting": add_job(conn, queue="mails", task="app.send", status="waiting"),
            "running": add_job(
                conn, queue="mails", status="running", attempts=1, started_ago=2, visible_in=28
            ),
            "succeeded": add_job(conn, queue="mails", status="succeeded", attempts=1),
            "cancelled": add_job(conn, queue="mails", status="cancelled"),
            "dead": add_dead(conn, queue="mails", task="app.send"),
            "other": add_job(conn, queue="reports", task="app.report"),
            "other_dead": add_dead(conn, queue="reports", task="app.report"),
        }


def statuses(engine: sa.Engine) -> dict[int, str]:
    with engine.connect() as conn:
        return dict(conn.execute(select(j.id, j.status)).all())  # type: ignore[arg-type]


def bulk_form(client: TestClient, **query: str | list[str]) -> Form:
    return post_form(client.get("/jobs", params=query).text, "/jobs/bulk")


def confirm(client: TestClient, form: Form, **fields: str | list[str]) -> str:
    """Post the list's form with ``fields``, then the confirmation page's; the page shown."""
    asked = client.post(form.action, data={**form.fields, **fields})
    assert asked.status_code == 200, asked.text
    confirmation = post_form(asked.text, "/jobs/bulk")
    assert confirmation.fields["confirmed"] == "yes"
    done = client.post(confirmation.action, data=confirmation.fields, follow_redirects=False)
    assert done.status_code == 303
    return client.get(done.headers["location"]).text


def test_cancel_chosen_rows_through_the_confirmation(
    engine: sa.Engine, client: TestClient, jobs: dict[str, int]
) -> None:
    form = bulk_form(client, queue="mails")
    chosen = [str(jobs["queued"]), str(jobs["waiting"])]
    asked = client.post(form.action, data={**form.fields, "action": "cancel", "id": chosen})
    assert "Cancel 2 chosen job(s)?" in asked.text
    assert statuses(engine)[jobs["queued"]] == "queued"  # nothing changes before confirming

    shown = confirm(client, form, action="cancel", id=chosen)

    assert "cancelled 2" in shown
    after = statuses(engine)
    assert (after[jobs["queued"]], after[jobs["waiting"]]) == ("cancelled", "cancelled")
    assert after[jobs["later"]] == "queued"


def test_cancel_all_matching_requests_running_and_leaves_other_queues(
    engine: sa.Engine, client: TestClient, jobs: dict[str, int]
) -> None:
    form = bulk_form(client, queue="mails")
    asked = client.post(form.action, data={**form.fields, "action": "cancel", "scope": "all"})
    assert "Cancel 3 jobs in queue mails?" in asked.text  # queued, later, running

    shown = confirm(client, form, action="cancel", scope="all")

    assert "cancelled 2; cancellation requested for 1 running" in shown
    after = statuses(engine)
    assert after[jobs["running"]] == "running"
    assert after[jobs["waiting"]] == "waiting"  # a filter does not reach waiting jobs
    assert after[jobs["other"]] == "queued"
    with engine.connect() as conn:
        flag = select(j.cancel_requested).where(j.id == jobs["running"])
        assert conn.execute(flag).scalar_one() is True


def test_retry_by_ids_and_by_filter(
    engine: sa.Engine, client: TestClient, jobs: dict[str, int]
) -> None:
    form = bulk_form(client)
    chosen = [str(jobs["dead"]), str(jobs["succeeded"])]
    shown = confirm(client, form, action="retry", id=chosen)
    assert "queued again 1; 1 left as they were" in shown
    assert statuses(engine)[jobs["dead"]] == "queued"

    form = bulk_form(client, status="dead")
    shown = confirm(client, form, action="retry", scope="all")
    assert "queued again 1" in shown
    after = statuses(engine)
    assert after[jobs["other_dead"]] == "queued"
    assert after[jobs["cancelled"]] == "cancelled"


def test_delete_never_removes_a_live_job(
    engine: sa.Engine, client: TestClient, jobs: dict[str, int]
) -> None:
    form = bulk_form(client, queue="mails")
    asked = client.post(form.action, data={**form.fields, "action": "delete", "scope": "all"})
    assert "Delete 3 jobs in queue mails?" in asked.text

    shown = confirm(client, form, action="delete", scope="all")

    assert "deleted 3" in shown
    after = statuses(engine)
    for gone in ("succeeded", "cancelled", "dead"):
        assert jobs[gone] not in after
    for kept in ("queued", "later", "waiting", "running", "other", "other_dead"):
        assert jobs[kept] in after
    # Chosen by id, a live job is left too.
    live = [str(jobs[k]) for k in ("queued", "waiting", "running")]
    shown = confirm(client, bulk_form(client), action="delete", id=live)
    assert "deleted 0; 3 left as they were" in shown
    assert {statuses(engine)[int(i)] for i in live} == {"queued", "waiting", "running"}


def test_run_now_makes_queued_jobs_due(
    engine: sa.Engine, client: TestClient, jobs: dict[str, int]
) -> None:
    shown = confirm(client, bulk_form(client, queue="mails"), action="run_now", scope="all")
    assert "made due now 1" in shown
    with engine.connect() as conn:
        due = select(j.visible_at <= sa.func.now()).where(j.id == jobs["later"])
        assert conn.execute(due).scalar_one() is True


def test_only_the_actions_that_apply_to_the_filter_are_enabled(
    client: TestClient, jobs: dict[str, int]
) -> None:
    html = client.get("/jobs", params={"status": "dead"}).text
    assert '<button type="submit" name="action" value="retry">' in html
    assert 'value="cancel" disabled' in html
    assert 'value="run_now" disabled' in html
    assert 'value="delete" disabled' not in html


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"action": "cancel"}, "no job chosen"),
        ({"action": "explode", "scope": "all"}, "unknown action"),
        ({"action": "cancel", "id": "1; DROP"}, "whole number"),
        ({"action": "cancel", "id": [str(i) for i in range(1, 1003)]}, "at most 1,000"),
        ({"action": "cancel", "scope": "all", "status": "lost"}, "unknown status"),
    ],
)
def test_bad_requests_are_refused_with_why(
    engine: sa.Engine,
    client: TestClient,
    jobs: dict[str, int],
    fields: dict[str, str | list[str]],
    message: str,
) -> None:
    form = bulk_form(client)
    before = statuses(engine)
    response = client.post(form.action, data={**form.fields, **fields, "confirmed": "yes"})
    assert response.status_code == 400
    assert message in response.text
    assert statuses(engine) == before


def test_read_only_no_checkbox_and_every_post_refused(
    engine: sa.Engine, client: TestClient, read_only_client: TestClient, jobs: dict[str, int]
) -> None:
    html = read_only_client.get("/jobs").text
    assert forms(html) == []
    assert 'name="id"' not in html
    form = bulk_form(client)
    fields = {**form.fields, "action": "delete", "scope": "all", "confirmed": "yes"}
    before = statuses(engine)

    refused = read_only_client.post(form.action, data=fields)

    assert refused.status_code == 403
    assert "actions are off" in refused.text
    assert statuses(engine) == before


def test_without_the_token_or_from_another_origin_nothing_changes(
    engine: sa.Engine, client: TestClient, jobs: dict[str, int]
) -> None:
    form = bulk_form(client)
    fields = {**form.fields, "action": "delete", "scope": "all", "confirmed": "yes"}
    before = statuses(engine)
    for forged in ({**fields, CSRF_FIELD: "forged.token"}, {**fields, CSRF_FIELD: ""}):
        response = client.post(form.action, data=forged)
        assert response.status_code == 403
        assert "security token" in response.text
    other_site = client.post(form.action, data=fields, headers={"origin": "http://evil.example"})
    assert other_site.status_code == 403
    assert statuses(engine) == before
    # The same form from the dashboard's own origin goes through.
    own = client.post(form.action, data=fields, headers={"origin": LOCAL})
    assert own.status_code == 200
    assert "deleted 4" in own.text  # every finished job: no filter


def test_a_job_another_session_holds_is_passed_over_not_waited_for(
    engine: sa.Engine, client: TestClient, jobs: dict[str, int]
) -> None:
    chosen = [str(jobs["queued"]), str(jobs["later"])]
    with engine.connect() as other, other.begin():
        # As a worker claiming it would: the row locked until that transaction ends.
        lock = select(j.id).where(j.id == jobs["queued"]).with_for_update()
        other.execute(lock).one()
        shown = confirm(client, bulk_form(client), action="cancel", id=chosen)
    assert "cancelled 1; 1 left as they were" in shown
    after = statuses(engine)
    assert (after[jobs["queued"]], after[jobs["later"]]) == ("queued", "cancelled")
