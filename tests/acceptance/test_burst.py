"""``sa-jobqueue worker --burst`` against every hold: it drains what it can start and exits.

Each test runs the real command in a subprocess with a deadline. What a burst waits for and
what it leaves behind is documented in docs/how-to/deploy-workers.md ("Burst mode"): it waits
for its own running jobs (and what their completions release), and for a rate window that
opens within ``BURST_WINDOW_WAIT``; a pause, a future ``run_at``, a dependency it is not running
itself, a cap whose slots other workers hold, and a rate window further off end it.
"""

from __future__ import annotations

import functools
import subprocess
import time
from datetime import timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sa_jobqueue._sql.claiming import rate_window
from sa_jobqueue.models import queues_table
from sa_jobqueue.ops import pause_queue, set_queue_concurrency, set_queue_key_rate, set_queue_rate
from sa_jobqueue.worker._claimer import BURST_WINDOW_WAIT
from tests.apps import limited
from tests.helpers import jobs
from tests.helpers.databases import url_string
from tests.helpers.processes import CLI, REPO_ROOT, WorkerApp, Workers, run_cli, subprocess_env
from tests.helpers.waiting import wait_for

pytestmark = pytest.mark.slow

WORKER_APP = WorkerApp("tests.apps.limited:queue", log_level="WARNING")
TABLES = limited.metadata
enqueue_many = functools.partial(jobs.enqueue_many, queue=limited.queue)

#: How long a burst may take here: far more than draining a few jobs needs on a loaded machine,
#: far less than the "never returns" the issue saw (a burst held by a hold it cannot end).
DEADLINE = 30.0


def burst(url: URL, *queues: str) -> float:
    """Run ``sa-jobqueue worker --burst`` to its end; its run time. Fails past DEADLINE."""
    command = [*CLI, "--log-level", "WARNING", "worker", WORKER_APP.target, "--burst"]
    command += ["--database-url", url_string(url), "--poll-interval", "0.2"]
    if queues:
        command += ["--queues", ",".join(queues)]
    began = time.monotonic()
    try:
        done = subprocess.run(
            command,
            cwd=REPO_ROOT,
            env=subprocess_env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=DEADLINE,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the burst worker was still running after {DEADLINE:g}s")
    assert done.returncode == 0, done.stderr
    return time.monotonic() - began


def statuses(engine: sa.Engine, ids: list[int]) -> dict[str, int]:
    return dict(jobs.statuses(engine, ids))


def test_a_paused_queue_with_a_rate_ends_the_burst_at_once(
    tables: sa.Engine, database_url: URL
) -> None:
    # The reproduction, through the CLI.
    url = url_string(database_url)
    limit = run_cli("queues", "limit", "limited", "--rate", "4/s", "--database-url", url)
    assert limit.returncode == 0, limit.stderr
    pause = run_cli("queues", "pause", "limited", "--database-url", url)
    assert pause.returncode == 0, pause.stderr
    ids = enqueue_many(tables, "work", [{"n": n} for n in range(3)])
    burst(database_url, "limited")
    assert statuses(tables, ids) == {"queued": 3}


@pytest.mark.parametrize("limit", ["none", "cap", "rate"])
def test_a_paused_queue_ends_the_burst_whatever_its_limits(
    tables: sa.Engine, database_url: URL, limit: str
) -> None:
    with tables.begin() as conn:
        if limit == "cap":
            set_queue_concurrency(conn, "limited", 2)
        elif limit == "rate":
            set_queue_rate(conn, "limited", "4/s")
        pause_queue(conn, "limited")
    ids = enqueue_many(tables, "work", [{"n": n} for n in range(3)])
    burst(database_url, "limited")
    assert statuses(tables, ids) == {"queued": 3}


def test_a_paused_queue_with_a_rate_per_key_ends_the_burst(
    tables: sa.Engine, database_url: URL
) -> None:
    # Jobs sharing a key are held back by the rate per key whatever has started: a pause must
    # not read as "that key's next window opens soon", window after window.
    with tables.begin() as conn:
        set_queue_key_rate(conn, "limited", "1/500ms", key="customer")
        pause_queue(conn, "limited")
    ids = enqueue_many(tables, "work", [{"n": n, "customer": n % 2} for n in range(5)])
    burst(database_url, "limited")
    assert statuses(tables, ids) == {"queued": 5}


def test_a_paused_queue_with_a_used_up_rate_window_ends_the_burst_at_once(
    tables: sa.Engine, database_url: URL
) -> None:
    period = 10.0  # a window that opens within BURST_WINDOW_WAIT: one a running queue waits for
    assert period <= BURST_WINDOW_WAIT
    with tables.begin() as conn:
        set_queue_rate(conn, "limited", "1/10s")
        pause_queue(conn, "limited")
    # Start early in a window, so that waiting for the next one would show.
    wait_for(lambda: window_left(tables, period) > 8.0, timeout=3 * period)
    with tables.begin() as conn:
        used_up = conn.execute(
            sa.update(queues_table)
            .where(queues_table.c.queue == "limited")
            .values(rate_window=rate_window(), rate_count=1)
            .returning(queues_table.c.rate_window)
        ).scalar_one()
    ids = enqueue_many(tables, "work", [{"n": n} for n in range(3)])
    burst(database_url, "limited")
    # The burst ended inside the window it found used up: it did not wait for the next one.
    with tables.connect() as conn:
        current = rate_window(sa.literal(timedelta(seconds=period), sa.Interval))
        assert conn.execute(sa.select(current)).scalar_one() == used_up
    assert statuses(tables, ids) == {"queued": 3}


def test_a_rate_window_that_opens_soon_is_waited_for_and_the_queue_drained(
    tables: sa.Engine, database_url: URL
) -> None:
    with tables.begin() as conn:
        set_queue_rate(conn, "limited", "4/s")
    ids = enqueue_many(tables, "unwritten", [{"n": n} for n in range(10)])
    burst(database_url, "limited")
    assert statuses(tables, ids) == {"succeeded": 10}


def test_a_rate_window_further_off_ends_the_burst_after_the_starts_it_allows(
    tables: sa.Engine, database_url: URL
) -> None:
    period = 3600.0  # windows are cut from the epoch: this one's end is an hour away at most
    with tables.begin() as conn:
        set_queue_rate(conn, "limited", "2/1h")
    # Near the end of a window the next one opens soon enough to be waited for: start in a
    # window with more than the wait and the deadline left (this waits only in the last minute
    # of an hour).
    wait_for(lambda: window_left(tables, period) > BURST_WINDOW_WAIT + DEADLINE, timeout=90)
    ids = enqueue_many(tables, "unwritten", [{"n": n} for n in range(5)])
    burst(database_url, "limited")  # the next window is past its deadline: it did not wait
    assert statuses(tables, ids) == {"succeeded": 2, "queued": 3}


def window_left(engine: sa.Engine, period: float) -> float:
    """Seconds until the rate window of ``period`` seconds that the database clock is in ends."""
    with engine.connect() as conn:
        now = conn.execute(sa.select(sa.func.extract("epoch", sa.func.now()))).scalar_one()
    return period - float(now) % period


def test_a_cap_held_by_another_workers_jobs_ends_the_burst(
    tables: sa.Engine, database_url: URL, workers: Workers
) -> None:
    with tables.begin() as conn:
        set_queue_concurrency(conn, "limited", 1)
    (holder,) = enqueue_many(tables, "work", [{"n": 0, "ms": 120_000}])
    workers.start(concurrency=1)
    workers.wait(lambda: jobs.statuses(tables, [holder]) == {"running": 1}, timeout=30)
    ids = enqueue_many(tables, "work", [{"n": n} for n in range(1, 4)])
    burst(database_url, "limited")
    assert statuses(tables, ids) == {"queued": 3}
    assert statuses(tables, [holder]) == {"running": 1}


def test_a_cap_held_by_its_own_jobs_is_waited_out_and_the_queue_drained(
    tables: sa.Engine, database_url: URL
) -> None:
    with tables.begin() as conn:
        set_queue_concurrency(conn, "limited", 1)
    ids = enqueue_many(tables, "work", [{"n": n, "ms": 20} for n in range(5)])
    burst(database_url, "limited")
    assert statuses(tables, ids) == {"succeeded": 5}


def test_a_future_run_at_ends_the_burst(tables: sa.Engine, database_url: URL) -> None:
    now = enqueue_many(tables, "work", [{"n": 0}])
    later = enqueue_many(tables, "work", [{"n": 1}], run_at=timedelta(minutes=5))
    burst(database_url, "limited")
    assert statuses(tables, now) == {"succeeded": 1}
    assert statuses(tables, later) == {"queued": 1}


def test_dependencies_the_burst_runs_release_their_dependents_and_others_end_it(
    tables: sa.Engine, database_url: URL
) -> None:
    queue = limited.queue
    with Session(tables) as session, session.begin():
        upstream = queue.enqueue(session, "work", {"n": 0})
        dependent = queue.enqueue(session, "work", {"n": 1}, depends_on=[upstream])
        later = queue.enqueue(session, "work", {"n": 2}, run_at=timedelta(minutes=5))
        blocked = queue.enqueue(session, "work", {"n": 3}, depends_on=[later])
    burst(database_url, "limited")
    assert statuses(tables, [upstream, dependent]) == {"succeeded": 2}
    assert statuses(tables, [later]) == {"queued": 1}
    assert statuses(tables, [blocked]) == {"waiting": 1}


#: The most runs of queue ``limited``'s jobs that overlapped, by their start and end records.
MOST_AT_ONCE_LIMITED = sa.text(
    """
    WITH spans AS (
        SELECT r.started, coalesce(r.ended, 'infinity') AS ended
        FROM limited_runs r JOIN sa_jobqueue_jobs j ON j.id = r.job_id
        WHERE j.queue = 'limited'
    )
    SELECT coalesce(max((SELECT count(*) FROM spans b
                         WHERE b.started <= a.started AND b.ended > a.started)), 0)
    FROM spans a
    """
)


def test_a_worker_of_every_queue_keeps_each_queues_pause_and_cap(
    tables: sa.Engine, database_url: URL
) -> None:
    # '*': one claim for the free queues, the limited claim for the capped one, none for the
    # paused one; its cap of 1 holds although the worker has threads to spare.
    with tables.begin() as conn:
        set_queue_concurrency(conn, "limited", 1)
        pause_queue(conn, "limited-paused")
    capped = enqueue_many(tables, "work", [{"n": n, "ms": 30} for n in range(4)])
    with Session(tables) as session, session.begin():
        paused = limited.queue.enqueue_many(session, "work", [{"n": 9}], queue="limited-paused")
        free = [
            job
            for n in range(20)
            for job in limited.queue.enqueue_many(
                session, "work", [{"n": 100 + n}], queue=f"limited-{n:02d}"
            )
        ]
    burst(database_url, "*")
    assert statuses(tables, capped) == {"succeeded": 4}
    assert statuses(tables, free) == {"succeeded": 20}
    assert statuses(tables, paused) == {"queued": 1}
    with tables.connect() as conn:
        assert conn.execute(MOST_AT_ONCE_LIMITED).scalar_one() == 1
