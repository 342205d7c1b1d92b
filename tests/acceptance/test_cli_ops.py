"""``sa-jobqueue stats | jobs ... | queues ... | check``, run in-process through ``cli.main``.

What the commands print is their product, so the tests read it: the JSON outputs parsed, the
tables split into cells. What they change is asserted in the database.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import update
from sqlalchemy.engine import URL

from sa_jobqueue import cli
from sa_jobqueue._sql.claiming import rate_window
from sa_jobqueue.cli import _job_changes, _operator, _stats
from sa_jobqueue.database import MIGRATE_HINT
from sa_jobqueue.models import jobs_table, queues_table, workers_table
from sa_jobqueue.ops import QueueLimits, RateLimit, paused_queues, queue_limits
from tests.helpers.databases import url_string
from tests.helpers.job_states import ERROR, add_dead, add_job, add_worker, ago
from tests.helpers.jobs import row, status_by_id

j = jobs_table.c


class Run:
    """Runs ``sa-jobqueue ...`` against the test's database and keeps what it printed."""

    def __init__(self, url: URL, capsys: pytest.CaptureFixture[str]) -> None:
        self.url = url_string(url)
        self.capsys = capsys
        self.out = self.err = ""

    def __call__(self, *args: str) -> int:
        self.capsys.readouterr()  # drop anything printed before
        status = cli.main([*args, "--database-url", self.url])
        self.out, self.err = self.capsys.readouterr()
        return status

    def json(self, *args: str) -> Any:
        assert self(*args, "--json") == 0, self.err
        return json.loads(self.out)


@pytest.fixture
def run(database_url: URL, capsys: pytest.CaptureFixture[str]) -> Run:
    return Run(database_url, capsys)


def one_line_error(run: Run) -> str:
    lines = run.err.strip().splitlines()
    assert len(lines) == 1, run.err
    assert lines[0].startswith("sa-jobqueue: ")
    assert "Traceback" not in run.err
    return lines[0]


def cells(text: str, first: str) -> list[str]:
    """The cells of the table row whose first cell is ``first``."""
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == first:
            return parts
    raise AssertionError(f"no row {first!r} in:\n{text}")


# -- stats -----------------------------------------------------------------------------------


def test_stats_table_and_json(run: Run, engine: sa.Engine) -> None:
    with engine.begin() as conn:
        add_job(conn, queue="mail", visible_in=-30)
        add_job(conn, queue="mail", status="running", attempts=1, started_ago=2, visible_in=28)
        add_job(conn, queue="mail", task="send", status="succeeded", started_ago=3, finished_ago=1)
        add_dead(conn, queue="mail", task="send", finished_ago=5)
        add_worker(conn, "w-1")

    assert run("stats") == 0
    # QUEUE WAITING QUEUED RUNNING SUCCEEDED DEAD CANCELLED DUE OLDEST-DUE SUCCEEDED DEAD
    # CANCELLED CAP RATE
    mail = cells(run.out, "mail")
    assert mail[1:8] == ["0", "1", "1", "1", "1", "0", "1"]
    assert mail[9:] == ["1", "1", "0", "-", "-"]  # no cap, no rate
    assert cells(run.out, "send")[1] == "2"  # finished within the window
    assert cells(run.out, "w-1")[1:3] == ["host-a", "4242"]

    data = run.json("stats", "--window", "1h")
    assert data["window"] == 3600
    (queue,) = data["queues"]
    assert queue["counts"] == {
        "waiting": 0,
        "queued": 1,
        "running": 1,
        "succeeded": 1,
        "dead": 1,
        "cancelled": 0,
    }
    assert queue["due"] == 1
    assert 30 <= queue["oldest_due_age"] < 60
    assert [t["task"] for t in data["tasks"]] == ["send"]
    assert data["tasks"][0]["p50"] == pytest.approx(1.5, abs=0.01)  # runs of 2 s and 1 s
    assert [w["name"] for w in data["workers"]] == ["w-1"]


def test_stats_watch_prints_until_interrupted(
    run: Run, engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    with engine.begin() as conn:
        add_job(conn)
    naps: list[float] = []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(_stats.time, "sleep", sleep)
    assert run("stats", "--json", "--watch", "2") == 0
    rounds = [json.loads(line) for line in run.out.splitlines()]
    assert len(rounds) == 2
    assert naps == [2.0, 2.0]
    assert all(r["queues"][0]["counts"]["queued"] == 1 for r in rounds)


def test_stats_on_a_database_without_the_schema(
    empty_database_url: URL, capsys: pytest.CaptureFixture[str]
) -> None:
    run = Run(empty_database_url, capsys)
    assert run("stats") == 1
    assert MIGRATE_HINT in one_line_error(run)
    assert run("jobs", "list") == 1
    assert MIGRATE_HINT in one_line_error(run)


def test_database_url_from_the_environment(
    database_url: URL, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", url_string(database_url))
    assert cli.main(["stats", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["queues"] == []
    monkeypatch.delenv("DATABASE_URL")
    assert cli.main(["stats"]) == 2
    assert "no database" in capsys.readouterr().err


# -- jobs list / show ------------------------------------------------------------------------


def test_jobs_list_filters_and_pages(run: Run, engine: sa.Engine) -> None:
    with engine.begin() as conn:
        dead = [add_dead(conn, queue="mail", task="send") for _ in range(3)]
        add_dead(conn, queue="mail", task="other")
        queued = add_job(conn, queue="mail", task="send")
        old = add_job(conn, queue="mail", task="send", created_ago=3 * 86400)

    found = run.json("jobs", "list", "--queue", "mail", "--task", "send", "--status", "dead")
    assert [job["id"] for job in found] == dead
    assert found[0]["last_error"] == ERROR

    assert run("jobs", "list", "--status", "dead,queued", "--task", "send", "--limit", "2") == 0
    listed = [int(line.split()[0]) for line in run.out.splitlines()[1:-1]]
    assert listed == dead[:2]
    assert run.out.splitlines()[-1] == f"(more: --after {dead[1]})"
    assert cells(run.out, str(dead[0]))[3:5] == ["dead", "3/3"]

    rest = run.json("jobs", "list", "--task", "send", "--after", str(dead[1]))
    assert [job["id"] for job in rest] == [dead[2], queued, old]
    older = run.json("jobs", "list", "--older-than", "2d")
    assert [job["id"] for job in older] == [old]


def test_jobs_list_newest_first_pages_backwards(run: Run, engine: sa.Engine) -> None:
    with engine.begin() as conn:
        sent = [add_job(conn, queue="mail", task="send") for _ in range(5)]
        add_job(conn, queue="mail", task="other")

    assert run("jobs", "list", "--task", "send", "--newest-first", "--limit", "2") == 0
    listed = [int(line.split()[0]) for line in run.out.splitlines()[1:-1]]
    assert listed == [sent[4], sent[3]]
    assert run.out.splitlines()[-1] == f"(more: --after {sent[3]} --newest-first)"

    rest = run.json("jobs", "list", "--task", "send", "--newest-first", "--after", str(sent[3]))
    assert [job["id"] for job in rest] == [sent[2], sent[1], sent[0]]


def test_jobs_list_refuses_bad_filters(run: Run) -> None:
    for args in (["--status", "exploded"], ["--older-than", "5 weeks"], ["--limit", "0"]):
        with pytest.raises(SystemExit) as exited:
            run("jobs", "list", *args)
        assert exited.value.code == 2


def test_jobs_show(run: Run, engine: sa.Engine) -> None:
    with engine.begin() as conn:
        job_id = add_dead(conn, payload={"order": 7})
    assert run("jobs", "show", str(job_id)) == 0
    assert f"id:           {job_id}" in run.out.splitlines()
    assert 'payload:      {"order": 7}' in run.out.splitlines()
    assert ERROR["traceback"] in run.out
    shown = run.json("jobs", "show", str(job_id))
    assert (shown["status"], shown["payload"]) == ("dead", {"order": 7})

    assert run("jobs", "show", "999999") == 1
    assert one_line_error(run) == "sa-jobqueue: no job with id 999999"


def test_jobs_list_by_tags_and_show_them(run: Run, engine: sa.Engine) -> None:
    with engine.begin() as conn:
        both = add_job(conn, tags=["billing", "customer:42"], meta={"request": "r-1", "n": 2})
        billing = add_job(conn, tags=["billing"])
        add_job(conn, tags=["customer:42"])
        plain = add_job(conn)

    billed = run.json("jobs", "list", "--tag", "billing")
    assert [job["id"] for job in billed] == [both, billing]
    assert billed[0]["tags"] == ["billing", "customer:42"]
    assert billed[0]["meta"] == {"request": "r-1", "n": 2}
    # Repeated: the jobs carrying every one of them.
    assert run("jobs", "list", "--tag", "billing", "--tag", "customer:42") == 0
    assert [int(line.split()[0]) for line in run.out.splitlines()[1:]] == [both]
    assert run.json("jobs", "list", "--tag", "nobody") == []

    assert run("jobs", "show", str(both)) == 0
    lines = run.out.splitlines()
    assert "tags:         billing, customer:42" in lines
    assert 'meta:         {"n": 2, "request": "r-1"}' in lines
    shown = run.json("jobs", "show", str(both))
    assert shown["tags"] == ["billing", "customer:42"]
    assert shown["meta"] == {"n": 2, "request": "r-1"}
    # A job without tags or meta shows neither line, and null in JSON.
    assert run("jobs", "show", str(plain)) == 0
    assert not [line for line in run.out.splitlines() if line.startswith(("tags:", "meta:"))]
    assert run.json("jobs", "show", str(plain))["tags"] is None


def test_jobs_show_the_progress_its_worker_wrote(run: Run, engine: sa.Engine) -> None:
    with engine.begin() as conn:
        reporting = add_job(conn, status="running", attempts=1, started_ago=60)
        bare = add_job(conn, status="running", attempts=1, started_ago=60)
        conn.execute(
            update(jobs_table)
            .where(jobs_table.c.id == reporting)
            .values(progress=0.4299, progress_message="file 3 of 7", progress_at=ago(5))
        )

    assert run("jobs", "show", str(reporting)) == 0
    lines = run.out.splitlines()
    assert "progress:     42% file 3 of 7" in lines  # rounded down: 100% is done
    assert [line for line in lines if line.startswith("progress at:  ") and "ago)" in line]
    shown = run.json("jobs", "show", str(reporting))
    assert (shown["progress"], shown["progress_message"]) == (0.4299, "file 3 of 7")
    assert shown["progress_at"].endswith("+00:00")  # ISO 8601, timezone-aware
    # Nothing reported: no line, null in JSON.
    assert run("jobs", "show", str(bare)) == 0
    assert not [line for line in run.out.splitlines() if line.startswith("progress")]
    assert run.json("jobs", "show", str(bare))["progress"] is None


def test_jobs_list_refuses_a_bad_tag(run: Run) -> None:
    for tag in ("has space", "-lead", "x" * 65, ""):
        with pytest.raises(SystemExit) as exited:
            run("jobs", "list", "--tag", tag)
        assert exited.value.code == 2


def history_entry(attempt: int, outcome: str, message: str) -> dict[str, Any]:
    """An entry of ``attempt_history`` as the fenced statements write it."""
    return {
        "attempt": attempt,
        "at": "2026-11-27T02:10:45.123456+00:00",
        "worker": f"host:{attempt}",
        "duration": 0.25,
        "outcome": outcome,
        "error": {"type": "builtins.ValueError", "message": message, "traceback": f"TB {message}"},
    }


def test_jobs_show_prints_the_attempts(run: Run, engine: sa.Engine) -> None:
    history = [history_entry(1, "retried", "first"), history_entry(2, "retried", "red\x1b[31m")]
    with engine.begin() as conn:
        job_id = add_job(conn, status="succeeded", attempts=3, started_ago=2, finished_ago=1)
        conn.execute(
            update(jobs_table)
            .where(jobs_table.c.id == job_id)
            .values(attempt_history=history, worker="host:3")
        )
    assert run("jobs", "show", str(job_id)) == 0
    assert obeyed(run.out) == []
    lines = run.out.splitlines()
    start = lines.index("attempts (oldest first; every traceback in --json):")
    attempts = [line.split() for line in lines[start + 2 :]]
    assert [row[:2] for row in attempts] == [["1", "retried"], ["2", "retried"], ["3", "succeeded"]]
    assert attempts[0][3:] == ["host:1", "0.250", "s", "builtins.ValueError:", "first"]
    assert attempts[1][-1] == "red\\x1b[31m"  # written out, not obeyed
    assert attempts[2][3:5] == ["host:3", "1.000"]
    shown = run.json("jobs", "show", str(job_id))
    assert shown["attempt_history"] == history


#: What a terminal obeys rather than shows: BEL, ESC sequences (colour, clear screen, a window
#: title), CR (which lets later text overwrite earlier), backspace, DEL, the C1 CSI, and a
#: bidirectional override.
CONTROLS = (
    "bell\x07 red\x1b[31m clear\x1b[2J title\x1b]0;owned\x07 bs\x08 del\x7f csi\x9b1m"
    " rtl\u202e cr\roverwritten"
)


def obeyed(text: str) -> list[str]:
    """The characters of ``text`` a terminal would act on: controls but line feed and tab."""
    return [
        c
        for c in text
        if (ord(c) < 0x20 and c not in "\n\t")
        or 0x7F <= ord(c) <= 0x9F
        or c in "\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029"
    ]


def test_jobs_show_and_list_print_control_characters_visibly(run: Run, engine: sa.Engine) -> None:
    with engine.begin() as conn:
        job_id = add_dead(
            conn,
            queue="hostile",
            task=f"task{CONTROLS}",
            payload={"text": CONTROLS},
            unique_key=CONTROLS,
            last_error={
                "type": f"Evil{CONTROLS}",
                "message": f"{CONTROLS}\nsecond line",
                "traceback": f"Traceback (most recent call last):\n  {CONTROLS}\nEvil",
            },
        )
    assert run("jobs", "show", str(job_id)) == 0
    assert obeyed(run.out) == []
    assert "red\\x1b[31m" in run.out  # shown, as the dashboard shows it
    assert "rtl\\u202e" in run.out
    assert run.out.count("\n") == run.out.rstrip("\n").count("\n") + 1  # no line of its own
    assert run("jobs", "list", "--queue", "hostile") == 0
    assert obeyed(run.out) == []
    (_, listed) = run.out.strip("\n").split("\n")
    assert listed.split()[0] == str(job_id)
    assert "  hostile  taskbell\\x07 red\\x1b[31m" in listed


def test_jobs_show_and_list_json_escape_control_characters(run: Run, engine: sa.Engine) -> None:
    # json.dumps escapes the C0 controls itself; DEL, C1, the bidi controls and the line and
    # paragraph separators it would print as they are.
    text = f"{CONTROLS} nel\x85 lre\u202a fsi\u2068 ls\u2028 ps\u2029"
    error = {"type": f"Evil{text}", "message": text, "traceback": f"Traceback\n  {text}"}
    with engine.begin() as conn:
        job_id = add_dead(
            conn,
            queue="hostile",
            task=f"task{text}",
            payload={"text": text},
            unique_key=text,
            last_error=error,
        )
    shown = run.json("jobs", "show", str(job_id))
    assert obeyed(run.out) == []
    assert "del\\u007f csi\\u009b1m rtl\\u202e" in run.out
    assert (shown["task"], shown["payload"], shown["unique_key"]) == (
        f"task{text}",
        {"text": text},
        text,
    )
    assert shown["last_error"] == error  # the escapes read back as the characters
    (listed,) = run.json("jobs", "list", "--queue", "hostile")
    assert obeyed(run.out) == []
    assert (listed["id"], listed["task"], listed["last_error"]) == (job_id, f"task{text}", error)


# -- jobs retry / cancel ---------------------------------------------------------------------


def test_jobs_retry_by_id(run: Run, engine: sa.Engine) -> None:
    with engine.begin() as conn:
        first, second = add_dead(conn), add_dead(conn, attempts=2, max_attempts=2)
        queued = add_job(conn)
    assert run("jobs", "retry", str(first)) == 0
    assert (row(engine, first).status, row(engine, first).max_attempts) == ("queued", 6)
    assert run("jobs", "retry", str(second), "--reset-attempts") == 0
    assert (row(engine, second).status, row(engine, second).attempts) == ("queued", 0)

    assert run("jobs", "retry", str(queued), "424242") == 1
    assert run.err.splitlines() == [
        f"sa-jobqueue: job {queued}: not dead but queued, left as it is",
        "sa-jobqueue: job 424242: no such job",
    ]


def test_jobs_retry_by_filter(run: Run, engine: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    # Several batches, each its own transaction.
    monkeypatch.setattr(_job_changes, "REQUEUE_BATCH", 2)
    with engine.begin() as conn:
        mail = [add_dead(conn, queue="mail") for _ in range(5)]
        other = add_dead(conn, queue="other")
    assert run("jobs", "retry", "--queue", "mail") == 0
    assert run.out.strip() == "requeued 5 dead job(s)"
    assert {status_by_id(engine)[i] for i in mail} == {"queued"}
    assert status_by_id(engine)[other] == "dead"
    assert run("jobs", "retry", "--all") == 0
    assert status_by_id(engine)[other] == "queued"


def test_jobs_retry_needs_ids_or_filters_not_both(run: Run, engine: sa.Engine) -> None:
    with engine.begin() as conn:
        job_id = add_dead(conn)
    assert run("jobs", "retry") == 2
    assert "give either job IDs or filters" in one_line_error(run)
    assert run("jobs", "retry", str(job_id), "--all") == 2
    assert status_by_id(engine)[job_id] == "dead"


def test_jobs_cancel(run: Run, engine: sa.Engine) -> None:
    with engine.begin() as conn:
        queued = add_job(conn)
        running = add_job(conn, status="running", attempts=1, started_ago=1, visible_in=29)
        done = add_job(conn, status="succeeded", attempts=1, started_ago=2)
    assert run("jobs", "cancel", str(queued), str(running)) == 0
    assert run.out.splitlines() == [
        f"job {queued}: cancelled",
        f"job {running}: cancellation requested; its worker stops it",
    ]
    assert row(engine, queued).status == "cancelled"
    assert (row(engine, running).status, row(engine, running).cancel_requested) == (
        "running",
        True,
    )
    assert run("jobs", "cancel", str(done)) == 1
    assert one_line_error(run) == f"sa-jobqueue: job {done}: already succeeded, left as it is"
    assert row(engine, done).status == "succeeded"


def test_jobs_cancel_by_filter_goes_batch_by_batch_past_running_jobs(
    run: Run, engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Batches of 2, each its own transaction; running jobs stay matching once asked to stop,
    # so a run that started again from the lowest id each batch would never end.
    monkeypatch.setattr(_job_changes, "BULK_BATCH", 2)
    with engine.begin() as conn:
        running = [
            add_job(conn, queue="mail", status="running", attempts=1, started_ago=1, visible_in=29)
            for _ in range(3)
        ]
        queued = [add_job(conn, queue="mail") for _ in range(3)]
        other = add_job(conn, queue="other")
    assert run("jobs", "cancel", "--queue", "mail", "--dry-run") == 0
    assert run.out.strip() == "would cancel or stop 6 job(s)"
    assert {status_by_id(engine)[i] for i in queued} == {"queued"}

    assert run("jobs", "cancel", "--queue", "mail") == 0, run.err
    assert run.out.splitlines() == ["cancelled 3 job(s); cancellation requested for 3"]
    assert {status_by_id(engine)[i] for i in queued} == {"cancelled"}
    assert {row(engine, i).cancel_requested for i in running} == {True}
    assert status_by_id(engine)[other] == "queued"

    assert run("jobs", "cancel", "7", "--queue", "mail") == 2
    assert "give either job IDs or filters" in one_line_error(run)


def test_jobs_run_now_by_id_and_by_filter(run: Run, engine: sa.Engine) -> None:
    with engine.begin() as conn:
        later = [add_job(conn, queue="mail", visible_in=3600) for _ in range(3)]
        due = add_job(conn, queue="mail")
        elsewhere = add_job(conn, queue="other", visible_in=3600)
    assert run("jobs", "run-now", str(later[0]), str(due)) == 0
    assert run.out.splitlines() == [
        "made 1 job(s) due now",
        "1 left as they were: not queued for later (already due, running, waiting or"
        " finished), or locked meanwhile",
    ]
    assert run("jobs", "run-now", "--queue", "mail", "--dry-run") == 0
    assert run.out.strip() == "would make due now 2 job(s)"
    assert run("jobs", "run-now", "--queue", "mail") == 0
    assert run.out.strip() == "made 2 job(s) due now"
    with engine.connect() as conn:
        not_due = conn.execute(
            sa.select(j.id).where(j.visible_at > sa.func.now()).order_by(j.id)
        ).scalars()
        assert list(not_due) == [elsewhere]
    assert run("jobs", "run-now") == 2
    assert "give either job IDs or filters" in one_line_error(run)


# -- jobs purge ------------------------------------------------------------------------------


def test_jobs_purge(run: Run, engine: sa.Engine) -> None:
    with engine.begin() as conn:
        old = [add_dead(conn, finished_ago=8 * 86400) for _ in range(5)]
        recent = add_dead(conn, finished_ago=3600)
        old_succeeded = add_job(conn, status="succeeded", finished_ago=8 * 86400)
        other_task = add_dead(conn, task="keep", finished_ago=8 * 86400)

    assert run("jobs", "purge", "--status", "dead", "--older-than", "7d", "--dry-run") == 0
    assert run.out.strip() == "would purge 6 dead job(s) finished over 7d ago"
    assert len(status_by_id(engine)) == 8

    args = ("--status", "dead", "--older-than", "7d", "--task", "work", "--batch", "2")
    assert run("jobs", "purge", *args) == 0
    assert run.out.strip() == "purged 5 dead job(s) finished over 7d ago of task work"
    assert set(status_by_id(engine)) == {recent, old_succeeded, other_task}
    assert not set(old) & set(status_by_id(engine))


@pytest.mark.parametrize("status", ["queued", "running", "dead,running"])
def test_jobs_purge_refuses_live_jobs(run: Run, engine: sa.Engine, status: str) -> None:
    with engine.begin() as conn:
        add_job(conn, created_ago=86400)
        add_job(conn, status="running", attempts=1, created_ago=86400)
        add_dead(conn, finished_ago=86400)
    assert run("jobs", "purge", "--status", status, "--older-than", "0") == 2
    assert "refusing to purge" in one_line_error(run)
    assert len(status_by_id(engine)) == 3


def test_jobs_purge_needs_status_and_age(run: Run) -> None:
    with pytest.raises(SystemExit) as exited:
        run("jobs", "purge", "--status", "dead")
    assert exited.value.code == 2


# -- check -----------------------------------------------------------------------------------


def test_check_exit_status_follows_the_worst_finding(run: Run, engine: sa.Engine) -> None:
    with engine.begin() as conn:
        add_worker(conn, "w-1")
    assert run("check") == 0, run.out
    assert all(line.startswith(("OK", " ")) for line in run.out.splitlines())

    with engine.begin() as conn:
        job_id = add_job(conn, visible_in=-600)
    assert run("check", "--max-wait", "5m") == 1
    assert cells(run.out, "WARNING")[1] == "backlog"
    assert run("check", "--max-wait", "15m") == 0

    with engine.begin() as conn:  # the only worker went quiet while a job is due
        conn.execute(update(workers_table).values(last_seen_at=ago(3600)))
    assert run("check", "--max-wait", "15m", "--json") == 2
    report = json.loads(run.out)
    assert report["status"] == "critical"
    by_check = {f["check"]: f for f in report["findings"]}
    assert by_check["workers"]["severity"] == "critical"
    assert by_check["workers"]["action"]
    assert by_check["backlog"]["severity"] == "ok"

    with engine.begin() as conn:
        conn.execute(update(jobs_table).where(j.id == job_id).values(visible_at=ago(-3600)))
    assert run("check", "--stale-after", "2h") == 0


def test_check_thresholds_from_options(run: Run, engine: sa.Engine) -> None:
    with engine.begin() as conn:
        add_worker(conn, "w-1")
        add_dead(conn, finished_ago=600)
        add_dead(conn, finished_ago=600)
    assert run("check") == 1
    assert cells(run.out, "WARNING")[1] == "dead_jobs"
    assert run("check", "--max-dead", "2") == 0
    assert run("check", "--dead-window", "5m") == 0


def test_check_without_the_schema_is_critical(
    empty_database_url: URL, capsys: pytest.CaptureFixture[str]
) -> None:
    run = Run(empty_database_url, capsys)
    assert run("check") == 2
    assert cells(run.out, "CRITICAL")[1] == "schema"
    assert f"what to do: {MIGRATE_HINT}" in run.out


# -- queues ----------------------------------------------------------------------------------


def paused(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return list(paused_queues(conn))


def test_pause_and_resume_commit_and_say_what_they_did(run: Run, engine: sa.Engine) -> None:
    assert run("queues", "pause", "emails") == 0, run.err
    assert run.out.strip() == "queue emails: paused"
    assert paused(engine) == ["emails"]
    assert run("queues", "pause", "emails") == 0
    assert run.out.strip() == "queue emails: already paused"

    assert run("queues", "resume", "emails") == 0, run.err
    assert run.out.strip() == "queue emails: resumed"
    assert paused(engine) == []
    assert run("queues", "resume", "emails") == 0
    assert run.out.strip() == "queue emails: already running"


def test_pausing_a_queue_nothing_knows_works_and_warns_that_it_is_unknown(
    run: Run, engine: sa.Engine
) -> None:
    # A pause before the queue's first job is useful (before a deploy), a typo is not: the
    # pause is made and kept, and one line on stderr says no such queue is known yet.
    assert run("queues", "pause", "nosuchqueue") == 0, run.err
    assert run.out.strip() == "queue nosuchqueue: paused"
    warning = one_line_error(run)
    assert "warning" in warning
    assert "nosuchqueue" in warning
    assert "no job, worker or setting" in warning
    assert paused(engine) == ["nosuchqueue"]
    # Known by now (its setting): no warning for the second pause, nor for the resume.
    assert run("queues", "pause", "nosuchqueue") == 0
    assert run.err == ""
    assert run("queues", "resume", "nosuchqueue") == 0
    assert run.err == ""


def test_pausing_a_queue_with_jobs_or_a_worker_says_nothing_more(
    run: Run, engine: sa.Engine
) -> None:
    with engine.begin() as conn:
        add_job(conn, queue="emails")
        add_dead(conn, queue="archive")
        conn.execute(
            sa.insert(workers_table).values(
                name="w1", host="h", pid=1, queues=["reports"], concurrency=1,
                last_seen_at=sa.func.now(),
            )
        )  # fmt: skip
    for name in ("emails", "archive", "reports"):
        assert run("queues", "pause", name) == 0, run.err
        assert (run.out.strip(), run.err) == (f"queue {name}: paused", "")
    assert run("queues", "resume", "elsewhere") == 0
    assert run.out.strip() == "queue elsewhere: already running"
    assert "no job, worker or setting" in one_line_error(run)


def test_queues_list_table_and_json(run: Run, engine: sa.Engine) -> None:
    with engine.begin() as conn:
        add_job(conn, queue="emails", visible_in=-60)
        add_job(conn, queue="emails", visible_in=3600)
        add_job(conn, queue="emails", status="running", attempts=1, started_ago=1, visible_in=29)
        add_job(conn, queue="reports")
    assert run("queues", "pause", "emails") == 0
    with engine.begin() as conn:
        conn.execute(update(queues_table).values(paused_at=ago(7200)))

    assert run("queues", "list") == 0, run.err
    assert cells(run.out, "QUEUE") == [
        "QUEUE", "HELD", "BACK", "BY", "CAP", "RATE", "QUEUED", "DUE", "RUNNING", "OLDEST", "DUE"
    ]  # fmt: skip
    assert cells(run.out, "emails")[:4] == ["emails", "paused", "2h", "ago"]
    assert cells(run.out, "emails")[4:9] == ["-", "-", "2", "1", "1"]
    assert cells(run.out, "reports")[1:7] == ["-", "-", "-", "1", "1", "0"]

    found = {item["queue"]: item for item in run.json("queues", "list")}
    assert list(found) == ["emails", "reports"]
    emails = found["emails"]
    assert (emails["queued"], emails["due"], emails["running"]) == (2, 1, 1)
    assert emails["held_back_by"] == ["paused"]
    assert emails["paused_at"] is not None
    assert emails["oldest_due_age"] == pytest.approx(60, abs=30)
    assert found["reports"]["held_back_by"] == []
    assert found["reports"]["paused_at"] is None


def test_queues_list_of_an_empty_database(run: Run) -> None:
    assert run("queues", "list") == 0
    assert run.out.strip() == "no queues: no live jobs, none paused or limited"
    assert run.json("queues", "list") == []


def test_stats_and_check_show_a_paused_queue(run: Run, engine: sa.Engine) -> None:
    with engine.begin() as conn:
        add_job(conn, queue="emails", visible_in=-7200, created_ago=7200)
        add_worker(conn, "w-1")
    assert run("queues", "pause", "emails") == 0
    with engine.begin() as conn:
        conn.execute(update(queues_table).values(paused_at=ago(7200)))

    assert run("stats") == 0
    assert cells(run.out, "emails")[:2] == ["emails", "(paused)"]
    assert run.json("stats")["queues"][0]["paused_at"] is not None

    assert run("check", "--max-paused", "1h", "--json") == 1, run.err  # a warning
    findings = {f["check"]: f for f in json.loads(run.out)["findings"]}
    assert findings["paused"]["severity"] == "warning"
    assert "emails" in findings["paused"]["message"]
    assert findings["backlog"]["severity"] == "ok"  # its due job waits by design
    assert run("check", "--max-paused", "3h", "--json") == 0, run.out
    assert {f["check"]: f for f in json.loads(run.out)["findings"]}["paused"]["severity"] == "ok"


@pytest.mark.parametrize("name", ["bad name", "x" * 65, "a/b", "_lead"])
def test_a_bad_queue_name_is_a_usage_error(run: Run, name: str) -> None:
    with pytest.raises(SystemExit) as exited:
        run("queues", "pause", name)
    assert exited.value.code == 2
    assert "invalid queue name" in run.capsys.readouterr().err


def test_a_database_without_the_schema_is_one_line(
    capsys: pytest.CaptureFixture[str], empty_database_url: sa.URL
) -> None:
    run = Run(empty_database_url, capsys)
    assert run("queues", "pause", "emails") == 1
    assert "sa-jobqueue migrate" in one_line_error(run)


# -- queues limit ----------------------------------------------------------------------------


def limits(engine: sa.Engine) -> dict[str, QueueLimits]:
    with engine.connect() as conn:
        return queue_limits(conn)


def use_up_the_window(engine: sa.Engine, queue: str, starts: int) -> None:
    """Record ``starts`` claims in ``queue``'s current rate window, as limited claims would."""
    with engine.begin() as conn:
        conn.execute(
            update(queues_table)
            .where(queues_table.c.queue == queue)
            .values(rate_window=rate_window(), rate_count=starts)
        )


def test_limit_sets_and_clears_limits_and_says_what_they_were(run: Run, engine: sa.Engine) -> None:
    assert run("queues", "limit", "emails", "--concurrency", "3", "--rate", "50/s") == 0, run.err
    assert run.out == "queue emails: at most 3 running, 50/1s (was: no cap, no rate)\n"
    assert limits(engine) == {"emails": QueueLimits(3, RateLimit(50, timedelta(seconds=1)))}

    assert run("queues", "limit", "emails", "--no-rate") == 0, run.err
    assert run.out == "queue emails: at most 3 running, no rate (was: at most 3 running, 50/1s)\n"
    assert run("queues", "limit", "emails", "--rate", "1000/h", "--no-concurrency") == 0
    assert run.out == "queue emails: no cap, 1000/1h (was: at most 3 running, no rate)\n"
    assert limits(engine) == {"emails": QueueLimits(None, RateLimit(1000, timedelta(hours=1)))}

    assert run("queues", "limit", "emails", "--concurrency", "1") == 0  # the rate is kept
    assert limits(engine) == {"emails": QueueLimits(1, RateLimit(1000, timedelta(hours=1)))}
    assert run("queues", "limit", "emails", "--clear") == 0, run.err
    assert run.out == "queue emails: no cap, no rate (was: at most 1 running, 1000/1h)\n"
    assert limits(engine) == {}
    assert run("queues", "limit", "emails", "--clear") == 0  # again: nothing to clear, not an error
    assert run.out == "queue emails: no cap, no rate (was: no cap, no rate)\n"


def test_limit_sets_and_removes_a_cap_per_key(run: Run, engine: sa.Engine) -> None:
    assert run("queues", "limit", "emails", "--per-key", "1", "--key", "customer_id") == 0
    assert run.out == (
        "queue emails: no cap, no rate, at most 1 per customer_id (was: no cap, no rate)\n"
    )
    assert limits(engine) == {"emails": QueueLimits(None, None, 1, "customer_id")}
    assert run("queues", "list") == 0, run.err
    assert cells(run.out, "emails")[1:5] == ["-", "-", "(1", "per"]
    assert run("queues", "limit", "emails", "--concurrency", "5", "--no-per-key") == 0
    assert limits(engine) == {"emails": QueueLimits(5, None)}
    with pytest.raises(SystemExit) as exited:
        run("queues", "limit", "emails", "--per-key", "2")  # needs --key
    assert exited.value.code == 2
    assert limits(engine) == {"emails": QueueLimits(5, None)}


def test_limit_sets_and_removes_a_rate_per_key_sharing_the_queues_key(
    run: Run, engine: sa.Engine
) -> None:
    per_second = RateLimit(10, timedelta(seconds=1))
    assert run("queues", "limit", "api", "--key-rate", "10/s", "--key", "customer_id") == 0
    assert run.out == "queue api: no cap, no rate, 10/1s per customer_id (was: no cap, no rate)\n"
    assert limits(engine) == {"api": QueueLimits(key_field="customer_id", key_rate=per_second)}
    assert run("queues", "list") == 0, run.err
    assert cells(run.out, "api")[1:6] == ["-", "-", "10/1s", "per", "customer_id"]
    assert run.json("queues", "list")[0]["limits"]["key_rate"] == {"limit": 10, "period": 1}

    # One key field per queue: a cap per key on another field is refused, and nothing changes.
    assert run("queues", "limit", "api", "--per-key", "2", "--key", "account") == 1
    assert "limited per 'customer_id' already" in one_line_error(run)
    assert run("queues", "limit", "api", "--per-key", "2", "--key", "customer_id") == 0
    both = QueueLimits(None, None, 2, "customer_id", per_second)
    assert limits(engine) == {"api": both}
    # Either goes alone; the field stays while the other is set.
    assert run("queues", "limit", "api", "--no-key-rate") == 0, run.err
    assert limits(engine) == {"api": QueueLimits(None, None, 2, "customer_id")}
    assert run("queues", "limit", "api", "--key-rate", "5/m", "--key", "customer_id") == 0
    assert run("queues", "limit", "api", "--no-per-key") == 0, run.err
    five = RateLimit(5, timedelta(minutes=1))
    assert limits(engine) == {"api": QueueLimits(key_field="customer_id", key_rate=five)}
    assert run("queues", "limit", "api", "--clear") == 0, run.err
    assert limits(engine) == {}


def test_limit_behind_a_held_settings_row_gives_up_and_changes_nothing(
    run: Run, engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert run("queues", "limit", "emails", "--concurrency", "2") == 0
    monkeypatch.setitem(_operator.OPERATOR_SETTINGS, "lock_timeout", "200ms")
    with engine.connect() as holder:
        # The queue's settings row, locked as a limited claim or another change holds it.
        holder.execute(sa.select(queues_table).with_for_update())
        assert run("queues", "limit", "emails", "--no-concurrency", "--rate", "5/s") == 1
        holder.rollback()
    assert "lock timeout" in one_line_error(run)
    assert limits(engine) == {"emails": QueueLimits(2, None)}


def test_queues_list_and_stats_show_limits_and_what_they_hold_back(
    run: Run, engine: sa.Engine
) -> None:
    with engine.begin() as conn:
        add_job(conn, queue="emails", visible_in=-60)
        add_job(conn, queue="emails", status="running", attempts=1, started_ago=1, visible_in=29)
        add_job(conn, queue="reports", visible_in=-60)
    assert run("queues", "limit", "emails", "--concurrency", "1", "--rate", "2/1000d") == 0
    assert run("queues", "limit", "reports", "--rate", "5/1000d") == 0
    assert run("queues", "limit", "webhooks", "--concurrency", "4") == 0  # no jobs yet
    use_up_the_window(engine, "emails", 2)
    use_up_the_window(engine, "reports", 3)

    assert run("queues", "list") == 0, run.err
    emails = cells(run.out, "emails")
    assert emails[1:10] == ["at", "cap,", "rate", "limit", "1", "2/1000d", "(used", "2)", "1"]
    assert cells(run.out, "reports")[1:5] == ["-", "-", "5/1000d", "(used"]
    assert cells(run.out, "webhooks")[1:4] == ["-", "4", "-"]

    found = {item["queue"]: item for item in run.json("queues", "list")}
    assert list(found) == ["emails", "reports", "webhooks"]
    assert found["emails"]["held_back_by"] == ["at cap", "rate limit"]
    assert found["emails"]["limits"] == {
        "concurrency": 1,
        "rate": {"limit": 2, "period": 1000 * 86400},
        "key_concurrency": None,
        "key_field": None,
        "key_rate": None,
    }
    assert found["emails"]["rate_used"] == 2
    assert (found["reports"]["held_back_by"], found["reports"]["rate_used"]) == ([], 3)
    assert found["webhooks"]["limits"] == {
        "concurrency": 4,
        "rate": None,
        "key_concurrency": None,
        "key_field": None,
        "key_rate": None,
    }

    assert run("stats") == 0, run.err
    assert cells(run.out, "emails")[-4:] == ["1", "2/1000d", "(used", "2)"]
    assert cells(run.out, "webhooks")[-2:] == ["4", "-"]
    stats = {q["queue"]: q for q in run.json("stats")["queues"]}
    assert stats["emails"]["limits"]["concurrency"] == 1
    assert stats["emails"]["rate_used"] == 2
    assert stats["webhooks"]["counts"]["queued"] == 0  # listed for its limit alone


def test_check_names_the_limits_of_a_late_limited_queue(run: Run, engine: sa.Engine) -> None:
    with engine.begin() as conn:
        add_worker(conn, "w-1")
        add_job(conn, queue="emails", visible_in=-600)
        add_job(conn, queue="emails", status="running", attempts=1, started_ago=1, visible_in=29)
        add_job(conn, queue="reports", visible_in=-600)
    assert run("queues", "limit", "emails", "--concurrency", "1", "--rate", "50/s") == 0

    assert run("check", "--max-wait", "5m", "--json") == 1, run.out  # a warning, as before
    backlog = {f["check"]: f for f in json.loads(run.out)["findings"]}["backlog"]
    # "10m", or a few seconds more on a loaded machine, slow between the insert and the check.
    oldest = r"oldest 10m(\d\ds)?"
    assert re.search(rf"emails \(1 due, {oldest}, cap 1, rate 50/1s\)", backlog["message"])
    assert re.search(rf"reports \(1 due, {oldest}\)", backlog["message"])
    assert "sa-jobqueue queues limit" in backlog["action"]

    with engine.begin() as conn:  # the only worker went quiet: nobody will start the due jobs
        conn.execute(update(workers_table).values(last_seen_at=ago(3600)))
    assert run("check", "--max-wait", "1h", "--json") == 2
    workers = {f["check"]: f for f in json.loads(run.out)["findings"]}["workers"]
    assert workers["severity"] == "critical"  # a cap does not make a dead cluster healthy


def test_a_database_error_of_no_known_kind_is_one_line_not_a_traceback(
    database_url: URL, capsys: pytest.CaptureFixture[str]
) -> None:
    """A role that may not read our tables: the server's refusal, said in one line."""
    import os

    role = f"sajq_noaccess_{os.getpid()}"
    admin = sa.create_engine(database_url.set(drivername="postgresql+psycopg"))
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE ROLE "{role}" LOGIN'))
    try:
        run = Run(database_url.set(username=role, password=None), capsys)
        assert run("worker", "tests.apps.acceptance:queue", "--burst") == 1
        assert "permission denied" in one_line_error(run)
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP OWNED BY "{role}"'))
            conn.execute(sa.text(f'DROP ROLE "{role}"'))
        admin.dispose()
