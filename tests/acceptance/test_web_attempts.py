"""The job page's table of attempts: each entry of the history, then the job's own attempt;
tracebacks folded in <details>, cut to the page's bound; hostile histories escaped."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from starlette.testclient import TestClient

from sa_jobqueue.models import jobs_table
from sa_jobqueue.web import _reads, create_app
from tests.helpers.job_states import add_job
from tests.helpers.pages import LOCAL

SCRIPT = "<script>alert(1)</script>"


@pytest.fixture
def client(engine: sa.Engine) -> Iterator[TestClient]:
    with TestClient(create_app(engine), base_url=LOCAL) as client:
        yield client


def with_history(engine: sa.Engine, history: Any, **options: Any) -> int:
    with engine.begin() as conn:
        job_id = add_job(conn, **options)
        conn.execute(
            sa.update(jobs_table)
            .where(jobs_table.c.id == job_id)
            .values(attempt_history=history, worker=options.get("status") and "host:3")
        )
    return job_id


def entry(attempt: int, outcome: str, message: str, traceback: str | None) -> dict[str, Any]:
    error = {"type": "builtins.ValueError", "message": message, "traceback": traceback}
    return {
        "attempt": attempt,
        "at": "2026-11-27T02:10:45.123456+00:00",
        "worker": f"host:{attempt}{SCRIPT}",
        "duration": 1.5,
        "outcome": outcome,
        "error": error,
    }


def attempts_table(html: str) -> list[list[str]]:
    body = html.split('<section id="attempts">', 1)[1].split("</section>", 1)[0]
    rows = re.findall(r"<tr>(.*?)</tr>", body.split("<tbody>", 1)[1], re.S)
    return [
        [re.sub(r"\s+", " ", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", r, re.S)]
        for r in rows
    ]


def test_the_attempts_of_a_job_that_failed_twice_then_succeeded(
    engine: sa.Engine, client: TestClient
) -> None:
    huge = "x" * (_reads.MAX_CHARS + 100)
    history = [entry(1, "retried", f"first {SCRIPT}", huge), entry(2, "retried", "second", None)]
    job_id = with_history(
        engine, history, status="succeeded", attempts=3, started_ago=2, finished_ago=1
    )
    html = client.get(f"/jobs/{job_id}").text
    assert SCRIPT not in html
    rows = attempts_table(html)
    assert [r[:2] for r in rows] == [["1", "retried"], ["2", "retried"], ["3", "succeeded"]]
    assert rows[0][3] == "host:1&lt;script&gt;alert(1)&lt;/script&gt;"
    assert rows[0][4] == "1.500 s"
    assert rows[2][3:5] == ["host:3", "1.000 s"]
    assert "first &lt;script&gt;" in rows[0][5]
    assert html.count("<details><summary>Traceback</summary>") == 1  # the second has none
    assert f"the first {_reads.MAX_CHARS:,} of" in rows[0][5]  # the traceback, cut


def test_a_job_without_history_has_no_table_but_its_running_attempt(
    engine: sa.Engine, client: TestClient
) -> None:
    queued = with_history(engine, None)
    assert 'id="attempts"' not in client.get(f"/jobs/{queued}").text
    running = with_history(engine, None, status="running", attempts=1, started_ago=1)
    assert [r[:2] for r in attempts_table(client.get(f"/jobs/{running}").text)] == [
        ["1", "running"]
    ]


@pytest.mark.parametrize(
    "history",
    [
        {"not": "an array"},
        [1, "x", None, {"error": "a string"}, {"attempt": {"deep": [SCRIPT]}, "at": SCRIPT}],
    ],
)
def test_a_history_of_any_shape_renders(
    engine: sa.Engine, client: TestClient, history: Any
) -> None:
    job_id = with_history(engine, history, status="dead", attempts=3, started_ago=2)
    page = client.get(f"/jobs/{job_id}")
    assert page.status_code == 200
    assert SCRIPT not in page.text
