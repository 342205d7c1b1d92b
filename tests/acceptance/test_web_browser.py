"""The dashboard in a real browser: headless Chromium (Debian's) driven through chromedriver.

The app runs on uvicorn in a thread against the test's database. The browser opens the
overview, filters the jobs list to dead jobs with the form, opens one, retries it, and sees it
queued, in the page and in the table; it pauses a queue from the queue's page and sets its
cap there; it opens the workflow view of a chord from one of its jobs. A screenshot of each
page is saved under ``$SA_JOBQUEUE_ARTEFACTS`` (or the test's temporary directory); with
``SA_JOBQUEUE_UPDATE_SCREENSHOT=1`` the overview's, the queue page's and the workflow view's
also replace docs/assets/dashboard-overview.png, dashboard-queue.png and
dashboard-workflow.png. Needs the Debian packages chromium and chromium-driver
(.ci/run installs them).
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sa_jobqueue import JobContext, JobQueue
from sa_jobqueue.models import jobs_table, periodic_table, workers_table
from sa_jobqueue.ops import (
    paused_queues,
    queue_limits,
    set_queue_concurrency,
    set_queue_key_rate,
)
from sa_jobqueue.testing import drain
from sa_jobqueue.web import create_app
from sa_jobqueue.web._serve import listen
from sa_jobqueue.workflows import Call
from tests.helpers.job_states import add_dead, add_job, add_worker
from tests.helpers.processes import REPO_ROOT

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
DOCS_ASSETS = REPO_ROOT / "docs" / "assets"
DOCS_SCREENSHOT = DOCS_ASSETS / "dashboard-overview.png"
WAIT = 20

pytestmark = [
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.skipif(
        CHROMIUM is None or CHROMEDRIVER is None,
        reason="no headless browser: apt-get install chromium chromium-driver",
    ),
]
j = jobs_table.c


@pytest.fixture
def artefacts(tmp_path: Path) -> Path:
    """Where the screenshots go: $SA_JOBQUEUE_ARTEFACTS/<test>, else the test's tmp_path."""
    root = os.environ.get("SA_JOBQUEUE_ARTEFACTS")
    where = Path(root) / "dashboard" if root else tmp_path / "screenshots"
    where.mkdir(parents=True, exist_ok=True)
    return where


@pytest.fixture
def served(engine: sa.Engine) -> Iterator[str]:
    """The dashboard, actions allowed, on uvicorn in a thread; its base URL."""
    import uvicorn

    sock = listen("127.0.0.1", 0)
    config = uvicorn.Config(create_app(engine, allow_actions=True), log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    assert CHROMIUM is not None
    assert CHROMEDRIVER is not None
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root, where Chromium's sandbox cannot start
        "--disable-dev-shm-usage",
        "--window-size=1280,860",
        "--force-device-scale-factor=1",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def history(engine: sa.Engine) -> int:
    """Three queues with an hour of history, workers, a schedule; the id of a dead job."""
    with engine.begin() as conn:
        for minute in range(60):
            for n in range(3 + (minute * 7) % 11):
                add_job(
                    conn,
                    queue="emails",
                    task="app.send_receipt",
                    status="succeeded",
                    attempts=1,
                    finished_ago=minute * 60 + n,
                )
            for n in range(minute % 4):
                add_job(
                    conn,
                    queue="reports",
                    task="app.nightly_report",
                    status="succeeded",
                    attempts=1,
                    finished_ago=minute * 60 + n,
                )
        for n in range(25):
            add_job(conn, queue="emails", task="app.send_receipt", visible_in=-n)
        for n in range(3):
            add_job(conn, queue="reports", task="app.sync_crm", visible_in=-40 - n)
        add_job(conn, queue="emails", status="running", attempts=1, started_ago=1, visible_in=29)
        error = {
            "type": "httpx.ConnectTimeout",
            "message": "timed out connecting to crm.example.com",
            "traceback": "Traceback (most recent call last):\n  ...\nhttpx.ConnectTimeout",
        }
        dead = [
            add_dead(
                conn,
                queue="reports",
                task="app.sync_crm",
                created_ago=900 + n * 400,
                finished_ago=300 + n * 400,
                last_error=error,
                payload={"account": 1000 + n},
            )
            for n in range(4)
        ]
        add_worker(conn, "app-1:19372:9b41d7c0")
        add_worker(conn, "app-2:20115:51e2aa07")
        conn.execute(sa.update(workers_table).values(queues=["emails", "reports"]))
        set_queue_concurrency(conn, "reports", 2)
        set_queue_key_rate(conn, "reports", "10/m", key="account")
        conn.execute(
            sa.insert(periodic_table).values(name="app.nightly_report", last_tick=func.now())
        )
        conn.execute(WEEK)
    return dead[-1]


#: A week of the hourly history for the two queues: busy days, quiet nights, a bad hour.
WEEK = sa.text(
    """
INSERT INTO sa_jobqueue_history (queue, hour, succeeded, dead, cancelled)
SELECT q, date_trunc('hour', now()) - make_interval(hours => h),
       (CASE WHEN q = 'emails' THEN 400 ELSE 60 END)
       * (1.2 + sin(2 * pi() * (h % 24) / 24.0))::numeric(4, 2),
       CASE WHEN h = 30 AND q = 'reports' THEN 40 WHEN h % 9 = 0 THEN 2 ELSE 0 END,
       CASE WHEN h % 13 = 0 THEN 3 ELSE 0 END
FROM unnest(ARRAY['emails', 'reports']) AS q, generate_series(0, 167) AS h
"""
)


def test_find_a_dead_job_and_retry_it(
    engine: sa.Engine, served: str, browser: WebDriver, artefacts: Path, history: int
) -> None:
    wait = WebDriverWait(browser, WAIT)

    browser.get(served + "/")
    wait.until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, "table.queues")))
    assert "reports" in browser.find_element(By.CSS_SELECTOR, "table.queues").text
    overview = artefacts / "1-overview.png"
    browser.save_screenshot(str(overview))

    browser.find_element(By.LINK_TEXT, "Jobs").click()
    wait.until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, "form.filters")))
    browser.find_element(By.CSS_SELECTOR, "input[name=status][value=dead]").click()
    browser.find_element(By.CSS_SELECTOR, "form.filters button[type=submit]").click()
    wait.until(expected_conditions.title_contains("Jobs"))
    wait.until(expected_conditions.text_to_be_present_in_element((By.TAG_NAME, "h1"), "Dead jobs"))
    statuses = {e.text for e in browser.find_elements(By.CSS_SELECTOR, "table.jobs .status")}
    assert statuses == {"dead"}
    browser.save_screenshot(str(artefacts / "2-dead-jobs.png"))

    browser.find_element(By.LINK_TEXT, str(history)).click()
    wait.until(expected_conditions.title_contains(f"Job {history}"))
    assert "ConnectTimeout" in browser.find_element(By.TAG_NAME, "main").text
    browser.save_screenshot(str(artefacts / "3-job.png"))

    # The browser's own POST, with the Origin header it chooses, through the origin check.
    browser.find_element(By.ID, "retry").click()
    wait.until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, ".flash.ok")))
    assert browser.find_element(By.CSS_SELECTOR, ".flash").text == f"job {history} is queued again"
    assert browser.find_element(By.CSS_SELECTOR, "h1 .status").text == "queued"
    assert browser.find_elements(By.ID, "retry") == []  # a queued job has no retry button
    browser.save_screenshot(str(artefacts / "4-retried.png"))
    with engine.connect() as conn:
        assert conn.execute(select(j.status).where(j.id == history)).scalar_one() == "queued"

    if os.environ.get("SA_JOBQUEUE_UPDATE_SCREENSHOT") == "1":
        DOCS_SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(overview, DOCS_SCREENSHOT)


def update_docs(shot: Path, name: str) -> None:
    if os.environ.get("SA_JOBQUEUE_UPDATE_SCREENSHOT") == "1":
        DOCS_ASSETS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, DOCS_ASSETS / name)


def test_pause_a_queue_and_cap_it_from_its_page(
    engine: sa.Engine, served: str, browser: WebDriver, artefacts: Path, history: int
) -> None:
    wait = WebDriverWait(browser, WAIT)
    browser.get(served + "/")
    wait.until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, "table.queues")))
    row = browser.find_element(By.XPATH, "//table[@class='queues']//tr[td/a[text()='emails']]")
    row.find_element(By.LINK_TEXT, "settings").click()
    wait.until(expected_conditions.title_contains("Queue emails"))
    assert browser.find_element(By.ID, "queue-state").text == "running"

    browser.find_element(By.ID, "pause").click()
    wait.until(expected_conditions.alert_is_present())  # the page's confirm()
    browser.switch_to.alert.accept()
    wait.until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, ".flash.ok")))
    assert "queue emails is paused" in browser.find_element(By.CSS_SELECTOR, ".flash").text
    assert browser.find_element(By.ID, "queue-state").text.startswith("paused")
    assert browser.find_element(By.ID, "queue-held").text == "paused"
    assert browser.find_elements(By.ID, "resume")
    with engine.connect() as conn:
        assert list(paused_queues(conn)) == ["emails"]

    cap = browser.find_element(By.ID, "concurrency")
    cap.clear()
    cap.send_keys("0")
    browser.find_element(By.ID, "save-limits").click()
    wait.until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, ".flash.failed")))
    assert "a cap must be from 1 to" in browser.find_element(By.CSS_SELECTOR, ".flash").text
    cap = browser.find_element(By.ID, "concurrency")
    cap.clear()
    cap.send_keys("3")
    browser.find_element(By.ID, "rate").send_keys("50/s")
    browser.find_element(By.ID, "save-limits").click()
    wait.until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, ".flash.ok")))
    assert browser.find_element(By.ID, "limit-cap").text == "at most 3 running"
    with engine.connect() as conn:
        assert queue_limits(conn)["emails"].concurrency == 3
    shot = artefacts / "5-queue.png"
    browser.save_screenshot(str(shot))
    update_docs(shot, "dashboard-queue.png")


def chord_queue() -> JobQueue:
    queue = JobQueue(default_queue="reports")

    @queue.task(keep_result=True)
    def fetch_region(ctx: JobContext, payload: dict[str, str]) -> int:
        return len(payload["region"])

    @queue.task(keep_result=True)
    def merge_totals(ctx: JobContext, payload: None) -> int:
        return sum(ctx.upstream_results().values())

    @queue.task()
    def publish_report(ctx: JobContext, payload: None) -> None:
        return None

    return queue


def test_open_the_workflow_view_of_a_chord(
    engine: sa.Engine, served: str, browser: WebDriver, artefacts: Path
) -> None:
    queue = chord_queue()
    regions = ["emea", "americas", "apac", "india", "oceania"]
    with Session(engine) as session, session.begin():
        *members, merge = queue.chord(
            session,
            [Call("fetch_region", {"region": r}) for r in regions[:3]],
            Call("merge_totals"),
        )
        queue.chain(session, [Call("publish_report")], depends_on=[merge])
    drain(queue, engine, max_jobs=2)  # two members done, the rest still to run
    with Session(engine) as session, session.begin():
        queue.chord(  # another chord, not joined to the first
            session,
            [Call("fetch_region", {"region": r}) for r in regions[3:]],
            Call("merge_totals"),
        )
    wait = WebDriverWait(browser, WAIT)
    browser.get(f"{served}/jobs/{members[0]}")
    wait.until(expected_conditions.title_contains(f"Job {members[0]}"))
    assert browser.find_element(By.CSS_SELECTOR, "#result pre").text == "4"
    browser.find_element(By.ID, "workflow-link").click()
    wait.until(expected_conditions.title_contains(f"Workflow of job {members[0]}"))
    nodes = browser.find_elements(By.CSS_SELECTOR, "svg.workflow a.node")
    assert len(nodes) == 5  # three members, the merge, the publish; not the other chord
    assert len(browser.find_elements(By.CSS_SELECTOR, "svg.workflow path.edge")) == 4
    layers = browser.find_elements(By.CSS_SELECTOR, "ol.layers > li")
    assert [len(li.find_elements(By.TAG_NAME, "a")) for li in layers] == [3, 1, 1]
    assert "waiting" in layers[1].text
    shot = artefacts / "6-workflow.png"
    browser.save_screenshot(str(shot))
    update_docs(shot, "dashboard-workflow.png")
    # Each box is a link to its job's page.
    browser.find_element(By.ID, f"node-{merge}").click()
    wait.until(expected_conditions.title_contains(f"Job {merge}"))
    assert len(browser.find_elements(By.CSS_SELECTOR, "#waits-for tbody tr")) == 3


def test_the_jobs_list_refreshes_in_place_unless_rows_are_ticked(
    engine: sa.Engine, served: str, browser: WebDriver
) -> None:
    with engine.begin() as conn:
        first = add_job(conn, queue="live", visible_in=600)
    wait = WebDriverWait(browser, WAIT)
    browser.get(served + "/jobs?queue=live")
    wait.until(expected_conditions.presence_of_element_located((By.ID, "bulk")))
    toggle = browser.find_element(By.ID, "auto-refresh")
    assert toggle.is_displayed()
    assert not toggle.is_selected()
    # Gone if the page were loaded again; the list's part is replaced (its mark goes).
    browser.execute_script("window.__kept = 1; document.getElementById('live').dataset.old = 'y'")

    def ids() -> set[str]:
        # Read in the page in one go: a refresh may replace the rows between two reads.
        found: list[str] = browser.execute_script(
            "return Array.from(document.querySelectorAll('#bulk input[name=id]'), b => b.value)"
        )
        return set(found)

    with engine.begin() as conn:
        second = add_job(conn, queue="live", visible_in=600)
    # Switched on, it refreshes at once: the new job's row comes, the page is not reloaded.
    toggle.click()
    wait.until(lambda _: str(second) in ids())
    assert browser.execute_script("return document.getElementById('live').dataset.old") is None
    assert browser.execute_script("return window.__kept") == 1

    # A row ticked for an action: the refresh holds off, and says so.
    browser.find_element(By.CSS_SELECTOR, f"#bulk input[name=id][value='{first}']").click()
    with engine.begin() as conn:
        third = add_job(conn, queue="live", visible_in=600)
    toggle.click()  # off and on: the refresh that switching on asks for at once ...
    toggle.click()
    held = browser.find_element(By.ID, "refresh-held")
    wait.until(lambda _: held.is_displayed())
    assert held.text == "paused while rows are ticked"
    assert str(third) not in ids()  # ... was held back
    assert browser.find_element(
        By.CSS_SELECTOR, f"#bulk input[name=id][value='{first}']"
    ).is_selected()
    # Cleared, the next round refreshes; the header's box still ticks every row.
    browser.find_element(By.CSS_SELECTOR, f"#bulk input[name=id][value='{first}']").click()
    toggle.click()
    toggle.click()
    wait.until(lambda _: str(third) in ids())
    assert not browser.find_element(By.ID, "refresh-held").is_displayed()
    assert browser.execute_script("return window.__kept") == 1
    browser.find_element(By.CSS_SELECTOR, "input.select-page").click()
    assert all(
        b.is_selected() for b in browser.find_elements(By.CSS_SELECTOR, "#bulk input[name=id]")
    )
    # Paused (unticked), it stays as it is; the choice is remembered in this browser.
    browser.find_element(By.CSS_SELECTOR, "input.select-page").click()
    toggle.click()
    assert browser.execute_script("return localStorage.getItem('sa_jobqueue.autoRefresh')") == "off"


def test_tick_two_rows_and_cancel_them_through_the_confirmation(
    engine: sa.Engine, served: str, browser: WebDriver, artefacts: Path
) -> None:
    with engine.begin() as conn:
        picked = [add_job(conn, queue="bulk", visible_in=600) for _ in range(2)]
        kept = add_job(conn, queue="bulk", visible_in=600)
    wait = WebDriverWait(browser, WAIT)

    browser.get(served + "/jobs?queue=bulk")
    wait.until(expected_conditions.presence_of_element_located((By.ID, "bulk")))
    # The script shows the header's box; ticking it and then clearing it ticks every row
    # and clears them again.
    page_box = browser.find_element(By.CSS_SELECTOR, "input.select-page")
    wait.until(lambda _: page_box.is_displayed())
    page_box.click()
    rows = browser.find_elements(By.CSS_SELECTOR, "#bulk input[name=id]")
    assert len(rows) == 3
    assert all(box.is_selected() for box in rows)
    page_box.click()
    assert not any(box.is_selected() for box in rows)
    for job_id in picked:
        browser.find_element(By.CSS_SELECTOR, f"#bulk input[name=id][value='{job_id}']").click()
    browser.find_element(By.CSS_SELECTOR, "#bulk button[value=cancel]").click()

    wait.until(expected_conditions.title_contains("Cancel jobs?"))
    assert "Cancel 2 chosen job(s)?" in browser.find_element(By.TAG_NAME, "h1").text
    browser.save_screenshot(str(artefacts / "bulk-1-confirm.png"))
    browser.find_element(By.CSS_SELECTOR, "main form button[type=submit]").click()

    wait.until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, ".flash.ok")))
    assert browser.find_element(By.CSS_SELECTOR, ".flash").text == "cancelled 2"
    browser.save_screenshot(str(artefacts / "bulk-2-done.png"))
    with engine.connect() as conn:
        found = dict(conn.execute(select(j.id, j.status).where(j.queue == "bulk")).all())
    assert found == {picked[0]: "cancelled", picked[1]: "cancelled", kept: "queued"}


def test_cancel_a_workflow_from_its_page_then_retry_it(
    engine: sa.Engine, served: str, browser: WebDriver, artefacts: Path
) -> None:
    queue = chord_queue()
    with Session(engine) as session, session.begin():
        flow = queue.chord(
            session,
            [Call("fetch_region", {"region": r}) for r in ("emea", "apac")],
            Call("merge_totals"),
        )
    wait = WebDriverWait(browser, WAIT)
    browser.get(f"{served}/jobs/{flow[-1]}")
    wait.until(expected_conditions.title_contains(f"Job {flow[-1]}"))
    browser.find_element(By.ID, "workflow-page-link").click()
    wait.until(expected_conditions.title_contains(f"Workflow {flow.id}"))
    assert browser.find_element(By.ID, "workflow-state").text == "active"
    rows = browser.find_elements(By.CSS_SELECTOR, "table.workflow-jobs tbody tr")
    assert len(rows) == 3

    browser.find_element(By.ID, "workflow-cancel").click()
    wait.until(expected_conditions.alert_is_present())  # the page's confirm()
    browser.switch_to.alert.accept()
    wait.until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, ".flash.ok")))
    assert browser.find_element(By.CSS_SELECTOR, ".flash").text.startswith(
        f"workflow {flow.id}: 3 job(s) cancelled"
    )
    assert browser.find_element(By.ID, "workflow-state").text == "failed"
    assert browser.find_elements(By.ID, "workflow-cancel") == []  # nothing left to cancel
    browser.save_screenshot(str(artefacts / "7-workflow-cancelled.png"))

    browser.find_element(By.ID, "workflow-retry").click()
    wait.until(
        expected_conditions.text_to_be_present_in_element((By.CSS_SELECTOR, ".flash"), "back")
    )
    assert browser.find_element(By.ID, "workflow-state").text == "active"
    with engine.connect() as conn:
        found = conn.execute(select(j.status).where(j.workflow_id == flow.id).order_by(j.id))
        assert found.scalars().all() == ["queued", "queued", "waiting"]


def test_filter_the_jobs_by_a_tag_and_read_a_jobs_labels_and_progress(
    engine: sa.Engine, served: str, browser: WebDriver, artefacts: Path
) -> None:
    queue = JobQueue()

    @queue.task(tags=["billing"], meta={"team": "pay"})
    def invoice(ctx: JobContext, payload: dict[str, int]) -> None:
        pass

    with Session(engine) as session, session.begin():
        tagged = queue.enqueue(session, "invoice", {"n": 1}, tags=["eu"], queue="labels")
        queue.enqueue(session, "invoice", {"n": 2}, queue="labels")
    # What a worker's lease renewal writes for a running attempt's report (see progress.md).
    with engine.begin() as conn:
        conn.execute(
            sa.update(jobs_table)
            .where(j.id == tagged)
            .values(progress=0.25, progress_message="page 1 of 4", progress_at=func.now())
        )
    wait = WebDriverWait(browser, WAIT)
    browser.get(f"{served}/jobs?queue=labels")
    wait.until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, "form.filters")))
    tag_box = browser.find_element(By.CSS_SELECTOR, "form.filters input[name=tag]")
    tag_box.clear()
    tag_box.send_keys("eu")
    browser.find_element(By.CSS_SELECTOR, "form.filters button[type=submit]").click()
    wait.until(expected_conditions.url_contains("tag=eu"))
    rows = browser.find_elements(By.CSS_SELECTOR, "table.jobs tbody tr")
    assert len(rows) == 1
    assert [t.text for t in rows[0].find_elements(By.CSS_SELECTOR, ".tag")] == ["billing", "eu"]
    browser.save_screenshot(str(artefacts / "8-jobs-by-tag.png"))

    browser.find_element(By.LINK_TEXT, str(tagged)).click()
    wait.until(expected_conditions.title_contains(f"Job {tagged}"))
    progress = browser.find_element(By.ID, "progress")
    assert progress.find_element(By.TAG_NAME, "progress").get_attribute("value") == "0.25"
    assert "25% page 1 of 4" in progress.text
    main = browser.find_element(By.TAG_NAME, "main").text
    assert '"team": "pay"' in main or '"team":"pay"' in main
    # A job's tag links to the jobs carrying it.
    browser.find_element(By.CSS_SELECTOR, "a.tag[href*='tag=eu']").click()
    wait.until(expected_conditions.url_contains("tag=eu"))
    assert len(browser.find_elements(By.CSS_SELECTOR, "table.jobs tbody tr")) == 1
    browser.save_screenshot(str(artefacts / "9-job-labels-progress.png"))
