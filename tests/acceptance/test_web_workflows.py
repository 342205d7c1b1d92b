"""The dashboard's job page shows a job's kept result and its dependencies both ways, and the
workflow view draws the jobs joined to it, over HTTP."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session
from starlette.testclient import TestClient

from sa_jobqueue import JobContext, JobQueue
from sa_jobqueue.models import dependencies_table
from sa_jobqueue.testing import drain
from sa_jobqueue.web import _workflow_reads, create_app
from sa_jobqueue.workflows import Call
from tests.helpers.job_states import add_job
from tests.helpers.pages import LOCAL, links


def make_queue() -> JobQueue:
    queue = JobQueue(default_queue="flows")

    @queue.task(keep_result=True)
    def square(ctx: JobContext, payload: Any) -> Any:
        return {"n": payload["n"] ** 2, "note": payload.get("note")}

    @queue.task(keep_result=True)
    def total(ctx: JobContext, payload: Any) -> int:
        return sum(r["n"] for r in ctx.upstream_results().values())

    @queue.task()
    def forget(ctx: JobContext, payload: Any) -> int:
        return 1

    return queue


@pytest.fixture
def client(engine: sa.Engine) -> Iterator[TestClient]:
    with TestClient(create_app(engine), base_url=LOCAL) as client:
        yield client


def text_of(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).strip()


def section(html: str, name: str) -> str:
    return html.split(f'<section id="{name}">')[1].split("</section>")[0]


def test_a_job_page_shows_its_result_and_what_it_waits_for_each_linked(
    engine: sa.Engine, client: TestClient
) -> None:
    queue = make_queue()
    with Session(engine) as session, session.begin():
        *members, callback = queue.chord(
            session,
            [Call("square", {"n": n, "note": "<b>" if n == 2 else None}) for n in range(3)],
            Call("total"),
        )
    before = client.get(f"/jobs/{callback}").text
    assert "Result" not in text_of(before)  # waiting: nothing kept yet
    waits = section(before, "waits-for")
    assert [f"/jobs/{m}" for m in members] == [
        link for link in links(waits) if link.startswith("/jobs/")
    ]
    assert "Waits for (3)" in text_of(waits)
    assert text_of(waits).count("pending") == 3
    assert drain(make_queue(), engine).succeeded == 4
    page = client.get(f"/jobs/{callback}").text
    assert text_of(section(page, "result")) == "Result 5"
    assert "settled" in text_of(section(page, "waits-for"))
    member = client.get(f"/jobs/{members[2]}").text
    assert "&lt;b&gt;" in section(member, "result")
    assert "<b>" not in section(member, "result")
    by = section(member, "waited-on-by")
    assert f"/jobs/{callback}" in links(by)
    assert "Waited on by (1)" in text_of(by)


def test_a_job_of_a_task_that_keeps_no_result_shows_none(
    engine: sa.Engine, client: TestClient
) -> None:
    queue = make_queue()
    with Session(engine) as session, session.begin():
        (alone,) = queue.group(session, [Call("forget")])
    drain(queue, engine)
    page = client.get(f"/jobs/{alone}").text
    assert 'id="result"' not in page
    assert "No dependency" in page
    assert "No job waits for this one" in page
    assert "workflow-link" not in page
    view = client.get(f"/jobs/{alone}/workflow").text
    assert "stands alone" in view


def test_the_lists_of_a_big_chord_are_bounded_and_say_so(
    engine: sa.Engine, client: TestClient
) -> None:
    queue = make_queue()
    with Session(engine) as session, session.begin():
        *_members, callback = queue.chord(
            session, [Call("square", {"n": n}) for n in range(120)], Call("total")
        )
    page = client.get(f"/jobs/{callback}").text
    waits = section(page, "waits-for")
    assert "Waits for (120)" in text_of(waits)
    assert len([x for x in links(waits) if x.startswith("/jobs/") and x[6:].isdigit()]) == 50
    assert "Showing the 50 lowest ids of 120" in text_of(waits)


def node_ids(html: str) -> list[int]:
    return [int(n) for n in re.findall(r'id="node-(\d+)"', html)]


def test_the_workflow_view_of_a_chord_draws_every_job_in_its_layer(
    engine: sa.Engine, client: TestClient
) -> None:
    queue = make_queue()
    with Session(engine) as session, session.begin():
        head, *_ = queue.chain(session, [Call("square", {"n": 1})])
        *members, callback = queue.chord(
            session, [Call("square", {"n": n}) for n in range(4)], Call("total")
        )
        (after,) = queue.chain(session, [Call("forget")], depends_on=[callback])
    html = client.get(f"/jobs/{members[1]}/workflow").text
    assert sorted(node_ids(html)) == sorted([*members, callback, after])
    assert head not in node_ids(html)  # not joined to the chord
    assert html.count('class="edge') == 5  # four into the callback, one out of it
    layers = re.findall(r"<li>(.*?)</li>", html.split('class="layers"')[1], flags=re.S)
    assert [sorted(map(int, re.findall(r'/jobs/(\d+)"', li))) for li in layers] == [
        sorted(members),
        [callback],
        [after],
    ]
    assert "waiting" in text_of(layers[1])
    # Every node links to its job page, and no script draws it.
    assert {f"/jobs/{n}" for n in node_ids(html)} <= set(links(html))
    assert "<script" not in html.split("</head>")[1]


def test_a_workflow_bigger_than_the_view_is_cut_and_says_so(
    engine: sa.Engine, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_workflow_reads, "MOST_JOBS", 10)
    queue = make_queue()
    with Session(engine) as session, session.begin():
        *_members, callback = queue.chord(
            session, [Call("square", {"n": n}) for n in range(30)], Call("total")
        )
    html = client.get(f"/jobs/{callback}/workflow").text
    assert len(node_ids(html)) == 10
    assert callback in node_ids(html)
    assert "has more than 10 jobs" in text_of(html)


def test_the_workflow_view_of_no_job_is_a_404(client: TestClient) -> None:
    assert client.get("/jobs/987654321/workflow").status_code == 404


def test_hostile_task_names_render_escaped_in_the_lists_and_the_graph(
    engine: sa.Engine, client: TestClient
) -> None:
    hostile = '<script>alert(1)</script>"\x1b'
    with engine.begin() as conn:
        first = add_job(conn, task=hostile, status="succeeded", attempts=1)
        then = add_job(conn, task="after", status="waiting")
        conn.execute(
            sa.insert(dependencies_table).values(
                job_id=then, depends_on=first, on_failure="run", pending=False
            )
        )
    for path in (f"/jobs/{then}", f"/jobs/{then}/workflow", f"/jobs/{first}/workflow"):
        html = client.get(path).text
        assert "<script>alert" not in html, path
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html, path
        assert "\x1b" not in html, path
    assert 'class="edge runs-anyway"' in client.get(f"/jobs/{then}/workflow").text


@pytest.mark.parametrize(
    ("arrows", "layers"),
    [
        ([], {1: 0}),
        ([(1, 2), (2, 3)], {1: 0, 2: 1, 3: 2}),
        # A diamond with a shortcut: 4 waits for 1 directly and through 2 and 3.
        ([(1, 2), (1, 3), (2, 3), (3, 4), (1, 4)], {1: 0, 2: 1, 3: 2, 4: 3}),
        # Two roots, one of them deeper: the join sits past the deeper path.
        ([(1, 3), (2, 4), (4, 3)], {1: 0, 2: 0, 3: 2, 4: 1}),
    ],
)
def test_each_job_sits_one_layer_past_the_deepest_job_it_waits_for(
    arrows: list[tuple[int, int]], layers: dict[int, int]
) -> None:
    assert _workflow_reads.layers_of(sorted(layers), arrows) == layers
