"""The dashboard's readers and actions against PostgreSQL, in a transaction rolled back after.

What each page shows (sa_jobqueue/web/_reads.py) and what each button does
(sa_jobqueue/web/_actions.py), called as the app calls them, on rows written straight into the
table (tests/helpers/job_states.py). Each test's jobs sit in queues of its own, since the
tier's database is shared.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import JSONB

from sa_jobqueue import JobContext, JobQueue
from sa_jobqueue.models import jobs_table, periodic_table
from sa_jobqueue.ops.health import Thresholds
from sa_jobqueue.web import _actions, _reads
from sa_jobqueue.web._actions import cancel, count_purge, purge, retry, retry_matching
from sa_jobqueue.web._display import json_text
from sa_jobqueue.web._filters import JobFilter
from sa_jobqueue.web._reads import (
    CHART_MINUTES,
    MAX_CHARS,
    read_job,
    read_jobs,
    read_overview,
    read_payload,
    read_schedules,
)
from tests.helpers.job_states import ERROR, add_dead, add_job, add_worker, ago
from tests.helpers.jobs import row

j = jobs_table.c


def status_of(conn: sa.Connection, job_id: int) -> str:
    return row(conn, job_id).status


# -- the overview ------------------------------------------------------------------------------


def test_overview_counts_each_queue_and_charts_its_last_hour(conn: sa.Connection) -> None:
    for _ in range(2):
        add_job(conn, queue="ov-a", visible_in=-30)  # due, waiting 30 s
    add_job(conn, queue="ov-a", visible_in=600)  # queued, not due
    add_job(conn, queue="ov-a", status="running", attempts=1, started_ago=5, visible_in=25)
    add_dead(conn, queue="ov-a", finished_ago=10)
    add_dead(conn, queue="ov-a", finished_ago=7200)  # dead for two hours: counted, not charted
    add_dead(conn, queue="ov-b", finished_ago=90)
    for _ in range(3):
        add_job(conn, queue="ov-a", status="succeeded", attempts=1, finished_ago=30)
    add_job(conn, queue="ov-a", status="succeeded", attempts=1, finished_ago=3 * 3600)
    add_job(conn, queue="ov-b", status="cancelled", finished_ago=300)
    add_worker(conn, "ov-live")
    add_worker(conn, "ov-stale", seen_ago=3600)

    overview = read_overview(conn, Thresholds())

    queues = {q.name: q for q in overview.queues}
    a, b = queues["ov-a"], queues["ov-b"]
    assert (a.queued, a.due, a.running, a.dead) == (3, 2, 1, 2)
    assert a.oldest_due == timedelta(seconds=30)
    assert a.finished == {"succeeded": 3, "dead": 1, "cancelled": 0}
    last = CHART_MINUTES - 1
    assert a.per_minute["succeeded"][last] == 3  # finished 30 s ago: the last minute
    assert a.per_minute["dead"][last] == 1
    assert sum(a.per_minute["succeeded"]) == 3
    assert a.busiest_minute == 4
    assert (b.queued, b.dead, b.oldest_due) == (0, 1, None)
    assert b.per_minute["dead"][last - 1] == 1  # 90 s ago: the minute before
    assert b.per_minute["cancelled"][last - 5] == 1  # 300 s ago: five minutes back
    assert [w.name for w in overview.workers if w.name.startswith("ov-")] == ["ov-live"]
    assert overview.registered_workers >= 2
    assert [f.check for f in overview.findings][:3] == ["schema", "workers", "backlog"]


def test_the_overview_shows_a_page_of_queues_by_name(
    conn: sa.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_reads, "QUEUES_SHOWN", 2)
    for name in ("pq-d", "pq-a", "pq-c", "pq-b", "pq-e"):
        add_job(conn, queue=name)
    add_job(conn, queue="pq-c", status="succeeded", attempts=1, finished_ago=30)

    first = read_overview(conn, Thresholds(), "pq-")
    assert [q.name for q in first.queues] == ["pq-a", "pq-b"]
    assert first.next_queues == "pq-b"
    second = read_overview(conn, Thresholds(), first.next_queues)
    assert [q.name for q in second.queues] == ["pq-c", "pq-d"]
    assert second.queues[0].finished == {"succeeded": 1, "dead": 0, "cancelled": 0}
    assert second.total_queues == first.total_queues >= 5
    last = read_overview(conn, Thresholds(), "pq-d")
    assert [q.name for q in last.queues][:1] == ["pq-e"]


# -- the jobs list -------------------------------------------------------------------------------


def page_ids(conn: sa.Connection, **filters: Any) -> tuple[list[int], int | None, int | None]:
    page = read_jobs(conn, JobFilter(**filters))
    return [job.id for job in page.jobs], page.next_after, page.previous_before


def test_jobs_page_by_keyset_both_ways_in_both_orders(conn: sa.Connection) -> None:
    ids = [add_job(conn, queue="pages") for _ in range(7)]
    new = sorted(ids, reverse=True)

    first, after, before = page_ids(conn, queue="pages", limit=3)
    assert (first, before) == (new[:3], None)
    second, after2, before2 = page_ids(conn, queue="pages", limit=3, after=after)
    assert second == new[3:6]
    last, after3, _ = page_ids(conn, queue="pages", limit=3, after=after2)
    assert (last, after3) == (new[6:], None)
    back, forward, before3 = page_ids(conn, queue="pages", limit=3, before=before2)
    assert (back, before3) == (new[:3], None)  # the first page again, and nothing before it
    assert forward == after  # whose next page is the second one again

    old = sorted(ids)
    first, after, _ = page_ids(conn, queue="pages", limit=4, order="oldest")
    assert first == old[:4]
    rest, after, before = page_ids(conn, queue="pages", limit=4, order="oldest", after=after)
    assert (rest, after, before) == (old[4:], None, old[4])


def test_a_page_stays_put_while_jobs_change_around_it(conn: sa.Connection) -> None:
    ids = [add_job(conn, queue="moving") for _ in range(6)]
    first, after, _ = page_ids(conn, queue="moving", limit=3)
    # Meanwhile: a new job arrives, one on the first page finishes and one on the next goes.
    add_job(conn, queue="moving")
    conn.execute(update(jobs_table).where(j.id == first[0]).values(queue="elsewhere"))
    conn.execute(sa.delete(jobs_table).where(j.id == min(ids)))
    second, _, _ = page_ids(conn, queue="moving", limit=3, after=after)
    assert second == sorted(ids, reverse=True)[3:5]  # neither repeated nor skipped


def test_jobs_filtered_by_status_read_the_partial_indexes_rows(conn: sa.Connection) -> None:
    queued = add_job(conn, queue="flt", task="t.one")
    running = add_job(conn, queue="flt", status="running", attempts=1, started_ago=1)
    dead = add_dead(conn, queue="flt", task="t.two", created_ago=7200)
    add_job(conn, queue="flt", status="succeeded", attempts=1)

    live, _, _ = page_ids(conn, queue="flt", statuses=("queued", "running"), order="oldest")
    assert live == [queued, running]
    assert page_ids(conn, queue="flt", statuses=("dead",))[0] == [dead]
    assert page_ids(conn, queue="flt", task="t.two")[0] == [dead]
    assert page_ids(conn, queue="flt", older_than=timedelta(hours=1))[0] == [dead]
    (listed,) = read_jobs(conn, JobFilter(queue="flt", statuses=("dead",))).jobs
    assert (listed.error_type, listed.error_message) == (ERROR["type"], ERROR["message"])


def test_a_rare_filter_searches_a_window_of_ids_per_page(
    conn: sa.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_reads, "SCAN_WINDOW", 4)
    ids = [add_job(conn, queue="win", task="rare" if n in (1, 2) else "common") for n in range(10)]

    first = read_jobs(conn, JobFilter(task="rare", limit=5))
    # The newest four ids hold no rare job: the page says how far it looked, and goes on.
    assert (first.jobs, first.searched) == ([], (ids[6], ids[9]))
    assert first.next_after == ids[6]
    second = read_jobs(conn, JobFilter(task="rare", limit=5, after=first.next_after))
    assert [j.id for j in second.jobs] == [ids[2]]
    assert second.searched == (ids[2], ids[5])
    third = read_jobs(conn, JobFilter(task="rare", limit=5, after=second.next_after))
    assert [j.id for j in third.jobs] == [ids[1]]  # the window reached the first id
    assert (third.searched, third.next_after) == (None, None)

    back = read_jobs(conn, JobFilter(task="rare", limit=5, before=third.jobs[0].id))
    assert ([j.id for j in back.jobs], back.previous_before) == ([ids[2]], ids[5])
    assert back.next_after == ids[2]  # forward from there: the page with ids[1] again

    oldest = read_jobs(conn, JobFilter(task="rare", order="oldest", limit=1))
    assert ([j.id for j in oldest.jobs], oldest.next_after) == ([ids[1]], ids[1])
    # A filter that a partial index serves (queued jobs: the claim index) reads no window.
    assert read_jobs(conn, JobFilter(queue="win", statuses=("queued",), limit=20)).searched is None


def test_created_over_a_day_ago_finds_jobs_however_far_below_the_newest(
    conn: sa.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Four ids a page here, as 50,000 at a million jobs: the old jobs lie far below the
    # newest ids, where a window read from the top never reached (the page said "No jobs").
    monkeypatch.setattr(_reads, "SCAN_WINDOW", 4)
    day = 86_400
    old = [add_job(conn, queue="aged", task="t", created_ago=2 * day + n) for n in (3, 2, 1)]
    for _ in range(12):
        add_job(conn, queue="aged", task="t")  # created now, with higher ids

    newest = read_jobs(conn, JobFilter(task="t", queue="aged", older_than=timedelta(days=1)))
    assert [j.id for j in newest.jobs] == old[::-1]
    oldest = read_jobs(
        conn, JobFilter(queue="aged", older_than=timedelta(days=1), order="oldest", limit=2)
    )
    assert [j.id for j in oldest.jobs] == old[:2]
    rest = read_jobs(
        conn,
        JobFilter(queue="aged", older_than=timedelta(days=1), order="oldest", after=old[1]),
    )
    # Past the last job created before the boundary, there is no page to look on for.
    assert ([j.id for j in rest.jobs], rest.next_after, rest.searched) == ([old[2]], None, None)
    none = read_jobs(conn, JobFilter(queue="aged", older_than=timedelta(days=3)))
    assert (none.jobs, none.next_after, none.searched) == ([], None, None)


def test_oldest_live_jobs_come_first_behind_any_history(conn: sa.Connection) -> None:
    history = [add_job(conn, queue="hist", status="succeeded", attempts=1) for _ in range(5)]
    live = [add_job(conn, queue="hist") for _ in range(3)]
    running = add_job(conn, queue="hist", status="running", attempts=1, started_ago=1)

    both = ("queued", "running")
    page = read_jobs(conn, JobFilter(queue="hist", statuses=both, order="oldest", limit=2))
    assert ([j.id for j in page.jobs], page.next_after) == (live[:2], live[1])
    rest = read_jobs(
        conn, JobFilter(queue="hist", statuses=both, order="oldest", limit=2, after=live[1])
    )
    assert ([j.id for j in rest.jobs], rest.next_after) == ([live[2], running], None)
    back = read_jobs(conn, JobFilter(queue="hist", statuses=both, order="oldest", before=live[2]))
    assert [j.id for j in back.jobs] == live[:2]
    newest = read_jobs(conn, JobFilter(queue="hist", statuses=("queued",), limit=2))
    assert [j.id for j in newest.jobs] == live[:0:-1]
    assert history[-1] < live[0]


# -- one job ---------------------------------------------------------------------------------------


def insert_raw(conn: sa.Connection, payload_text: str, error: Any = None) -> int:
    """A dead job whose payload is ``payload_text`` as jsonb (deeper than Python would write)."""
    job_id: int = conn.execute(
        sa.insert(jobs_table)
        .values(
            queue="raw",
            task="raw",
            payload=sa.cast(sa.literal(payload_text, sa.Text), JSONB),
            status="dead",
            attempts=1,
            max_attempts=1,
            finished_at=func.now(),
            last_error=error,
        )
        .returning(j.id)
    ).scalar_one()
    return job_id


def test_a_big_payload_is_cut_for_the_page_and_whole_for_download(conn: sa.Connection) -> None:
    big = json.dumps({"blob": "x" * 1_000_000})
    job_id = insert_raw(conn, big)
    job = read_job(conn, job_id)
    assert job is not None
    assert len(job.payload) == MAX_CHARS
    assert job.payload_length == len(big)
    assert read_payload(conn, job_id) == big
    assert read_payload(conn, 0) is None


def test_deep_json_reads_as_text(conn: sa.Connection) -> None:
    deep = "[" * 3000 + "]" * 3000  # Python's json module could not load this
    job_id = insert_raw(conn, deep)
    job = read_job(conn, job_id)
    assert job is not None
    assert job.payload == deep
    assert json_text(job.payload, job.payload_length) == deep


def test_the_last_error_comes_apart_and_cut(conn: sa.Connection) -> None:
    error = {"type": "app.Boom", "message": "m" * (MAX_CHARS + 10), "traceback": "Traceback\n"}
    job = read_job(conn, insert_raw(conn, "{}", error))
    assert job is not None
    assert (job.error_kind, job.error_type, job.error_traceback) == (
        "object",
        "app.Boom",
        "Traceback\n",
    )
    assert len(job.error_message or "") == MAX_CHARS
    assert job.error_message_length == MAX_CHARS + 10
    odd = read_job(conn, insert_raw(conn, "{}", "just a string"))
    assert odd is not None
    assert (odd.error_kind, odd.error_json, odd.error_type) == ("string", '"just a string"', None)


def test_the_timeline_tells_what_the_row_records(conn: sa.Connection) -> None:
    job_id = add_dead(conn, queue="tl", created_ago=100, started_ago=50, finished_ago=40)
    job = read_job(conn, job_id)
    assert job is not None
    assert [e.label for e in job.timeline] == ["enqueued", "attempt 3 started", "dead"]
    retried = read_job(conn, add_job(conn, queue="tl", attempts=1, visible_in=60))
    assert retried is not None
    assert [(e.label, e.note) for e in retried.timeline] == [
        ("enqueued", ""),
        ("scheduled", "retry"),
    ]
    assert read_job(conn, 0) is None


# -- periodic schedules ----------------------------------------------------------------------------


def test_schedules_as_stored_and_as_declared(conn: sa.Connection) -> None:
    queue = JobQueue()

    @queue.periodic("*/5 * * * *", name="web.every_five")
    @queue.task
    def every_five(ctx: JobContext, payload: dict[str, Any]) -> None: ...

    for name, last_tick in (("web.every_five", ago(3600)), ("web.gone", ago(0))):
        conn.execute(sa.insert(periodic_table).values(name=name, last_tick=last_tick))
    stored = {r.name: r for r in read_schedules(conn, None).rows}
    assert stored["web.gone"].schedule is None
    assert stored["web.every_five"].next_tick is None

    declared = {r.name: r for r in read_schedules(conn, queue.schedules).rows}
    five = declared["web.every_five"]
    assert five.schedule is not None
    assert five.schedule.cron == "*/5 * * * *"
    assert five.next_tick is not None
    assert five.next_tick.minute % 5 == 0
    assert five.overdue_tick is not None  # an hour behind: no worker enqueued its ticks
    assert declared["web.gone"].schedule is None


# -- actions -------------------------------------------------------------------------------------


def test_retry_a_dead_job_and_say_why_not_otherwise(conn: sa.Connection) -> None:
    dead = add_dead(conn, queue="act")
    assert retry(conn, dead, "extend").ok
    assert status_of(conn, dead) == "queued"
    again = retry(conn, dead, "extend")
    assert (again.ok, again.text) == (False, f"job {dead} is queued, not dead: left as it is")
    assert retry(conn, 0, "reset").text == "job 0: no such job"
    held = add_dead(conn, queue="act", task="uniq", unique_key="k")
    add_job(conn, queue="act", task="uniq", unique_key="k")
    assert "unique key" in retry(conn, held, "reset").text
    assert status_of(conn, held) == "dead"


def test_cancel_queued_and_running_jobs(conn: sa.Connection) -> None:
    queued = add_job(conn, queue="act")
    running = add_job(conn, queue="act", status="running", attempts=1, started_ago=1)
    assert cancel(conn, queued).text == f"job {queued} is cancelled"
    assert "cancellation requested" in cancel(conn, running).text
    assert row(conn, running).cancel_requested
    finished = cancel(conn, queued)
    assert (finished.ok, finished.text) == (
        False,
        f"job {queued} is already cancelled: left as it is",
    )


def test_retry_dead_jobs_by_filter(conn: sa.Connection) -> None:
    mine = [add_dead(conn, queue="bulk", task="t.a", created_ago=7200) for _ in range(3)]
    recent = add_dead(conn, queue="bulk", task="t.a")
    other = add_dead(conn, queue="bulk-other", task="t.a", created_ago=7200)
    held = add_dead(conn, queue="bulk", task="t.a", created_ago=7200, unique_key="k")
    add_job(conn, queue="bulk", task="t.a", unique_key="k")

    outcome = retry_matching(
        conn, queue="bulk", task="t.a", older_than=timedelta(hours=1), attempts="reset"
    )

    assert outcome.text.startswith("3 dead job(s) queued again; 1 still dead")
    assert [status_of(conn, i) for i in mine] == ["queued"] * 3
    assert row(conn, mine[0]).attempts == 0
    assert [status_of(conn, i) for i in (recent, other, held)] == ["dead"] * 3


def test_purge_finished_jobs_by_status_and_age(conn: sa.Connection) -> None:
    old = [add_dead(conn, queue="purge-q", finished_ago=7200) for _ in range(2)]
    young = add_dead(conn, queue="purge-q", finished_ago=10)
    done = add_job(conn, queue="purge-q", status="succeeded", attempts=1, finished_ago=7200)
    cancelled = add_job(conn, queue="purge-q", status="cancelled", finished_ago=7200)
    hour = timedelta(hours=1)

    assert count_purge(conn, statuses=["dead", "cancelled"], older_than=hour) == 3
    outcome = purge(conn, statuses=["dead"], older_than=hour)

    assert outcome.text == "purged 2 dead job(s) finished over 1h ago"
    remaining = set(conn.execute(select(j.id).where(j.queue == "purge-q")).scalars())
    assert remaining == {young, done, cancelled}
    assert not remaining & set(old)
    assert count_purge(conn, statuses=["dead", "cancelled"], older_than=hour) == 1


@pytest.mark.parametrize("attempts", ["extend", "reset"])
def test_requeued_by_filter_as_one_by_one(conn: sa.Connection, attempts: str) -> None:
    one = add_dead(conn, queue="same-a", attempts=3, max_attempts=3)
    many = add_dead(conn, queue="same-b", attempts=3, max_attempts=3)
    retry(conn, one, attempts)  # type: ignore[arg-type]
    retry_matching(conn, queue="same-b", task=None, older_than=None, attempts=attempts)  # type: ignore[arg-type]
    a, b = row(conn, one), row(conn, many)
    assert (a.status, a.attempts, a.max_attempts, a.finished_at, a.worker) == (
        b.status,
        b.attempts,
        b.max_attempts,
        b.finished_at,
        b.worker,
    )


def test_purge_counts_no_further_than_one_click_past(
    conn: sa.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_actions, "MAX_BATCH", 2)
    for _ in range(5):
        add_dead(conn, queue="purge-many", finished_ago=7200)
    selection: dict[str, Any] = {"statuses": ["dead"], "older_than": timedelta(hours=1)}
    assert count_purge(conn, **selection) == 3  # "over 2"
    outcome = purge(conn, **selection)
    assert (
        outcome.text
        == "purged 2 dead job(s) finished over 1h ago; over 2 left (purge again to continue)"
    )
    assert count_purge(conn, **selection) == 3
    purge(conn, **selection)
    assert purge(conn, **selection).text == "purged 1 dead job(s) finished over 1h ago"
    assert count_purge(conn, **selection) == 0
