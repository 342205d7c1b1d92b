"""``sa-jobqueue web --root-path``: the address it prints answers, and so does each link.

The command runs as a user runs it; the tests fetch the address it printed, follow a link of
that page, and ask as a proxy that removed the prefix would. A prefix that starts like the
dashboard's own pages is refused before anything listens.
"""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import httpx2
import sqlalchemy as sa
from sqlalchemy.engine import URL

from sa_jobqueue.cli._web import OWN_SEGMENTS
from sa_jobqueue.web import create_app
from tests.helpers.databases import url_string
from tests.helpers.job_states import add_dead
from tests.helpers.pages import links
from tests.helpers.processes import CLI, REPO_ROOT, subprocess_env
from tests.helpers.waiting import wait_for

#: A trailing slash as a user may type it: the printed address has one, not two.
ROOTED = ("--port", "0", "--root-path", "/ops/queue/")


def test_the_printed_address_and_its_links_answer_under_the_prefix(
    engine: sa.Engine, database_url: URL, tmp_path: Path
) -> None:
    with engine.begin() as conn:
        dead = add_dead(conn, queue="emails", task="app.send", finished_ago=60)
    err = tmp_path / "web.err"
    with err.open("w") as stderr:
        proc = subprocess.Popen(
            [*CLI, "web", "--database-url", url_string(database_url), *ROOTED],
            cwd=REPO_ROOT,
            env=subprocess_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        found = wait_for(lambda: re.search(r"(http://\S+) \(read-only", err.read_text()), 30)
        printed = found[1]
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/ops/queue/", printed)
        with httpx2.Client(timeout=10) as client:
            page = client.get(printed)
            assert page.status_code == 200
            jobs = [link for link in links(page.text) if link.startswith("/ops/queue/jobs?")]
            assert jobs, links(page.text)
            origin = printed.removesuffix("/ops/queue/")
            assert client.get(origin + jobs[0]).status_code == 200
            # As a proxy that removed the prefix forwards it: the same page, links under it.
            removed = client.get(origin + f"/jobs/{dead}")
            assert removed.status_code == 200
            assert f"/ops/queue/jobs/{dead}/payload.json" in links(removed.text)
            assert client.get(origin + f"/ops/queue/jobs/{dead}/payload.json").status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in err.read_text()


def test_a_prefix_like_the_dashboards_own_pages_is_refused(database_url: URL) -> None:
    for value, says in [
        ("/jobs", "'/jobs' starts like the dashboard's own /jobs pages"),
        ("dashboard", "'dashboard' is not a path prefix like /dashboard"),
    ]:
        result = subprocess.run(
            [*CLI, "web", "--database-url", url_string(database_url), "--root-path", value],
            cwd=REPO_ROOT,
            env=subprocess_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 1
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(f"sa-jobqueue: --root-path: {says}")


def test_the_refused_segments_are_the_dashboards_own(engine: sa.Engine) -> None:
    app = create_app(engine)
    firsts = {route.path.split("/")[1] for route in app.routes if hasattr(route, "path")}
    assert firsts - {""} <= set(OWN_SEGMENTS)
