"""Cluster-wide limits against real ``sa-jobqueue worker`` subprocesses.

The workers run ``tests.apps.limited:queue``. Each handler records when it started and when it
was about to return (``limited_runs``, the database's ``clock_timestamp()``), and writes its
effect through ``ctx.session`` (``limited_effects``, one row per job at most). While the
workers run, a thread samples the jobs holding slots (running with a live lease) from the
database. Concurrency inside the handlers is computed from the recorded intervals afterwards.
"""

from __future__ import annotations

import functools
import signal
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy import func, select

from sa_jobqueue.models import jobs_table
from sa_jobqueue.ops import (
    set_queue_concurrency,
    set_queue_key_concurrency,
    set_queue_key_rate,
    set_queue_rate,
)
from tests.apps import limited
from tests.apps.limited import effects, runs
from tests.helpers import jobs
from tests.helpers.processes import WorkerApp, Workers

pytestmark = pytest.mark.slow

WORKER_APP = WorkerApp("tests.apps.limited:queue", log_level="WARNING")
TABLES = limited.metadata
j = jobs_table.c
enqueue_many = functools.partial(jobs.enqueue_many, queue=limited.queue)

#: Most handlers of the queue running at once, from the recorded intervals. A run without an
#: end record ended no later than its job's next attempt started (its attempt had to be settled
#: first, and its handler returns or raises before that), and, if its worker was killed, no
#: later than ``:killed_at``. Taking neither (running for ever) would count it beside every
#: later run of its key: on a loaded server an attempt can fail between its two records.
MOST_AT_ONCE = sa.text(
    """
    WITH spans AS (
        SELECT r.key, r.started,
               coalesce(r.ended, least(
                   (SELECT min(n.started) FROM limited_runs n
                    WHERE n.job_id = r.job_id AND n.attempt > r.attempt),
                   :killed_at)) AS ended
        FROM limited_runs r
    )
    SELECT coalesce(max(n), 0) FROM (
        SELECT (SELECT count(*) FROM spans b
                WHERE b.started <= a.started
                  AND b.ended > a.started
                  AND (NOT :per_key OR b.key = a.key)) AS n
        FROM spans a
    ) AS counts
    """
)


def most_at_once(
    engine: sa.Engine, *, per_key: bool = False, killed_at: datetime | None = None
) -> int:
    with engine.connect() as conn:
        params = {"per_key": per_key, "killed_at": killed_at or datetime.max}
        return int(conn.execute(MOST_AT_ONCE, params).scalar_one())


def holding(conn: sa.Connection) -> int:
    """The queue's jobs holding slots: running with a live lease."""
    query = select(func.count()).where(
        j.queue == "limited", j.status == "running", j.visible_at > func.now()
    )
    return int(conn.execute(query).scalar_one())


@contextmanager
def sampled(engine: sa.Engine) -> Iterator[list[int]]:
    """Samples :func:`holding` every few milliseconds while the block runs."""
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        with engine.connect() as conn:
            while not stop.is_set():
                samples.append(holding(conn))
                conn.rollback()
                stop.wait(0.005)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join(timeout=10)


def effects_per_job(engine: sa.Engine, ids: list[int]) -> dict[int, int]:
    with engine.connect() as conn:
        rows = conn.execute(select(effects.c.job_id, func.count()).group_by(effects.c.job_id)).all()
    found = {job_id: n for job_id, n in rows}
    return {job_id: found.get(job_id, 0) for job_id in ids}


def test_a_cap_of_3_holds_across_4_workers_of_8_threads(
    tables: sa.Engine, workers: Workers
) -> None:
    engine = tables
    with engine.begin() as conn:
        set_queue_concurrency(conn, "limited", 3)
    ids = enqueue_many(engine, "work", [{"n": n, "ms": 30} for n in range(120)])
    with sampled(engine) as samples:
        procs = [workers.start(concurrency=8) for _ in range(4)]
        workers.wait(lambda: jobs.statuses(engine, ids) == {"succeeded": 120}, timeout=120)
    workers.terminate_all()
    assert max(samples) == 3, max(samples)  # reached, never passed
    assert most_at_once(engine) <= 3
    assert set(effects_per_job(engine, ids).values()) == {1}
    # Spread over the workers: the cap is the cluster's, not one process's.
    with engine.connect() as conn:
        pids = set(conn.execute(select(runs.c.pid)).scalars())
    assert len(pids) >= 2, pids
    assert len(procs) == 4


def test_a_cap_of_3_holds_when_completions_claim_the_next_jobs(
    tables: sa.Engine, workers: Workers
) -> None:
    """Jobs that write nothing through their session complete in the worker's batches, and a
    batch that frees slots claims the next jobs in the same statement: the cap still holds,
    and every job runs once."""
    engine = tables
    with engine.begin() as conn:
        set_queue_concurrency(conn, "limited", 3)
    ids = enqueue_many(engine, "unwritten", [{"n": n, "ms": 5} for n in range(300)])
    with sampled(engine) as samples:
        for _ in range(4):
            workers.start(concurrency=8)
        workers.wait(lambda: jobs.statuses(engine, ids) == {"succeeded": 300}, timeout=120)
    workers.terminate_all()
    assert max(samples) == 3
    assert most_at_once(engine) == 3
    with engine.connect() as conn:
        per_job = conn.execute(select(runs.c.job_id, func.count()).group_by(runs.c.job_id)).all()
    assert sorted(job_id for job_id, _ in per_job) == sorted(ids)
    assert {n for _, n in per_job} == {1}


def test_a_killed_worker_keeps_its_slots_until_its_leases_expire(
    tables: sa.Engine, workers: Workers
) -> None:
    engine = tables
    with engine.begin() as conn:
        set_queue_concurrency(conn, "limited", 3)
    ids = enqueue_many(engine, "short_lease", [{"n": n, "ms": 300} for n in range(40)])
    with sampled(engine) as samples:
        procs = [workers.start(concurrency=8) for _ in range(4)]

        def a_worker_holding_slots() -> int | None:
            with engine.connect() as conn:
                pids = conn.execute(
                    select(runs.c.pid).where(runs.c.ended.is_(None)).distinct()
                ).scalars()
                return next(iter(pids), None)

        victim_pid = workers.wait(a_worker_holding_slots, timeout=30)
        (victim,) = [p for p in procs if p.pid == victim_pid]
        workers.signal(victim, signal.SIGKILL)
        with engine.connect() as conn:
            killed_at = conn.execute(select(func.clock_timestamp())).scalar_one()
        workers.wait(lambda: jobs.statuses(engine, ids) == {"succeeded": 40}, timeout=120)
    workers.terminate_all()
    assert max(samples) <= 3, max(samples)
    with engine.connect() as conn:
        lost = conn.execute(
            select(func.count()).where(runs.c.pid == victim_pid, runs.c.ended.is_(None))
        ).scalar_one()
        # The lost jobs ran again after their leases, not before: nobody took their slots.
        rerun_after = conn.execute(
            select(func.min(runs.c.started)).where(runs.c.attempt == 2)
        ).scalar_one()
    assert lost >= 1
    assert rerun_after is not None
    assert rerun_after >= killed_at
    assert most_at_once(engine, killed_at=killed_at) <= 3
    assert set(effects_per_job(engine, ids).values()) == {1}


def test_a_run_with_no_recorded_end_ends_by_its_jobs_next_attempt(tables: sa.Engine) -> None:
    # The measure itself: on a loaded server an attempt can fail between its start and end
    # records (a statement past its deadline). Its run is over by the time its job's next
    # attempt starts, not running for ever beside every later job of its key.
    engine = tables
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    at = [t0 + timedelta(seconds=s) for s in (0, 2, 2.1, 3, 3.1)]
    with engine.begin() as conn:
        conn.execute(
            runs.insert(),
            [
                {"job_id": 1, "attempt": 1, "pid": 1, "key": "a", "started": at[0], "ended": None},
                {"job_id": 1, "attempt": 2, "pid": 1, "key": "a", "started": at[1], "ended": at[2]},
                {"job_id": 2, "attempt": 1, "pid": 1, "key": "a", "started": at[3], "ended": at[4]},
            ],
        )
    assert most_at_once(engine, per_key=True) == 1
    # A run that truly overlaps another of its key is still counted.
    with engine.begin() as conn:
        conn.execute(
            runs.insert().values(job_id=3, attempt=1, pid=1, key="a", started=at[0], ended=at[3])
        )
    assert most_at_once(engine, per_key=True) == 2


def test_a_cap_of_1_per_key_runs_each_keys_jobs_one_at_a_time_in_order(
    tables: sa.Engine, workers: Workers
) -> None:
    """The order is claim order, by due time: a job whose attempt failed is due again after
    its backoff, behind its key's next jobs (docs/how-to/flow-control.md). One job's first
    attempt fails before its handler records a start, as an attempt can on a loaded machine;
    the jobs that ran on their first attempt keep each key's order around it."""
    engine = tables
    with engine.begin() as conn:
        set_queue_key_concurrency(conn, "limited", 1, key="customer")
    payloads: list[dict[str, object]] = [{"n": n, "customer": n % 10, "ms": 10} for n in range(200)]
    payloads[128]["fail_first"] = True
    ids = enqueue_many(engine, "work", payloads)
    for _ in range(4):
        workers.start(concurrency=8)
    workers.wait(lambda: jobs.statuses(engine, ids) == {"succeeded": 200}, timeout=120)
    workers.terminate_all()
    assert most_at_once(engine, per_key=True) == 1
    assert most_at_once(engine) > 1  # different keys did run side by side
    with engine.connect() as conn:
        order = conn.execute(
            select(runs.c.key, runs.c.job_id).order_by(runs.c.key, runs.c.started)
        ).all()
        failed_first = (
            conn.execute(select(runs.c.attempt).where(runs.c.job_id == ids[128])).scalars().all()
        )
        # Jobs that took more than one attempt, with the record of the attempts that did not
        # succeed: the one made to fail, and any whose lease a loaded machine lost.
        retried = {
            job_id: (attempts, history)
            for job_id, attempts, history in conn.execute(
                select(j.id, j.attempts, j.attempt_history).where(j.id.in_(ids), j.attempts > 1)
            )
        }
    assert failed_first == [2]  # one run, its second attempt
    assert ids[128] in retried
    for attempts, history in retried.values():
        assert len(history) == attempts - 1, history  # each retry has its cause on record
    assert len(retried) < 20, retried  # the order below is checked for most jobs
    per_key: dict[str, list[int]] = {}
    for key, job_id in order:
        per_key.setdefault(key, []).append(job_id)
    assert len(per_key) == 10
    for key, started in per_key.items():
        # Each key's jobs that ran on their first attempt started in enqueue order.
        first_tries = [job_id for job_id in started if job_id not in retried]
        assert first_tries == sorted(first_tries), (key, started, retried)
    assert set(effects_per_job(engine, ids).values()) == {1}


def test_a_rate_of_50_per_second_holds_in_every_window(tables: sa.Engine, workers: Workers) -> None:
    engine = tables
    with engine.begin() as conn:
        set_queue_rate(conn, "limited", "50/s")
    ids = enqueue_many(engine, "work", [{"n": n} for n in range(500)])
    for _ in range(4):
        workers.start(concurrency=8)
    workers.wait(lambda: jobs.statuses(engine, ids) == {"succeeded": 500}, timeout=120)
    workers.terminate_all()
    with engine.connect() as conn:
        second = func.date_trunc("second", j.started_at)
        windows = conn.execute(
            select(second, func.count()).where(j.id.in_(ids)).group_by(second).order_by(second)
        ).all()
    counts = [n for _, n in windows]
    assert max(counts) <= 50, counts  # windows are whole seconds of the database clock
    # 500 starts at 50 a second: 10 full windows, plus the partial first and last ones.
    assert len(counts) <= 12, counts
    assert sum(sorted(counts)[-10:]) >= 475, counts
    assert set(effects_per_job(engine, ids).values()) == {1}


def test_a_rate_of_5_per_second_per_key_holds_for_each_key_side_by_side(
    tables: sa.Engine, workers: Workers
) -> None:
    engine = tables
    with engine.begin() as conn:
        set_queue_key_rate(conn, "limited", "5/s", key="customer")
    payloads = [{"n": n, "customer": n % 4} for n in range(60)] + [{"n": 60 + n} for n in range(20)]
    ids = enqueue_many(engine, "work", payloads)
    for _ in range(2):
        workers.start(concurrency=4)
    workers.wait(lambda: jobs.statuses(engine, ids) == {"succeeded": 80}, timeout=60)
    workers.terminate_all()
    with engine.connect() as conn:
        second = func.date_trunc("second", j.started_at)
        customer = j.payload["customer"].astext
        windows = conn.execute(
            select(customer, second, func.count()).where(j.id.in_(ids)).group_by(customer, second)
        ).all()
    keyed = [(key, at, n) for key, at, n in windows if key is not None]
    assert max(n for _, _, n in keyed) <= 5, windows  # whole seconds of the database clock
    # 15 jobs a key at 5 a second: 3 full windows, plus the partial first and last ones.
    for key in "0123":
        assert sum(n for k, _, n in keyed if k == key) == 15
        assert len([at for k, at, _ in keyed if k == key]) <= 5, windows
    # The keys ran side by side, and the jobs without a key were not held at all.
    assert max(Counter(at for _, at, _ in keyed).values()) == 4, windows
    assert max(n for key, _, n in windows if key is None) > 5, windows
    assert set(effects_per_job(engine, ids).values()) == {1}


def test_a_limited_queue_at_its_cap_leaves_the_workers_other_queue_running(
    tables: sa.Engine, workers: Workers
) -> None:
    engine = tables
    with engine.begin() as conn:
        set_queue_concurrency(conn, "limited", 1)
    slow = enqueue_many(engine, "work", [{"n": n, "ms": 200} for n in range(10)])
    fast = enqueue_many(engine, "other", [{"n": n} for n in range(200)])
    workers.start("--queues", "limited,other", concurrency=4)
    workers.wait(lambda: jobs.statuses(engine, fast) == {"succeeded": 200}, timeout=60)
    # The other queue was done long before the capped one, which runs one job at a time.
    assert jobs.statuses(engine, slow).get("succeeded", 0) < 10
    workers.wait(lambda: jobs.statuses(engine, slow) == {"succeeded": 10}, timeout=60)
    workers.terminate_all()
    assert most_at_once(engine, per_key=False) >= 1
    with engine.connect() as conn:
        capped_at_once = conn.execute(
            sa.text(
                "SELECT max((SELECT count(*) FROM limited_runs b JOIN sa_jobqueue_jobs jb"
                " ON jb.id = b.job_id AND jb.queue = 'limited'"
                " WHERE b.started <= a.started AND b.ended > a.started))"
                " FROM limited_runs a JOIN sa_jobqueue_jobs ja ON ja.id = a.job_id"
                " AND ja.queue = 'limited'"
            )
        ).scalar_one()
    assert capped_at_once == 1


def test_a_cap_changed_at_run_time_takes_effect_without_a_restart(
    tables: sa.Engine, workers: Workers
) -> None:
    engine = tables
    with engine.begin() as conn:
        set_queue_concurrency(conn, "limited", 5)
    ids = enqueue_many(engine, "work", [{"n": n, "ms": 100} for n in range(150)])
    with sampled(engine) as samples:
        for _ in range(2):
            workers.start(concurrency=8)
        workers.wait(lambda: max(samples, default=0) == 5, timeout=30)
        with engine.begin() as conn:
            set_queue_concurrency(conn, "limited", 2)
        # Jobs already running finish; then no more than 2 run.
        workers.wait(lambda: samples[-1] <= 2, timeout=10)
        lowered = len(samples)
        workers.wait(lambda: len(samples) > lowered + 100, timeout=10)
        assert max(samples[lowered:]) <= 2
        with engine.begin() as conn:
            set_queue_concurrency(conn, "limited", None)
        cleared = len(samples)
        workers.wait(lambda: max(samples[cleared:], default=0) > 2, timeout=10)
        workers.wait(lambda: jobs.statuses(engine, ids) == {"succeeded": 150}, timeout=60)
    workers.terminate_all()
    assert set(effects_per_job(engine, ids).values()) == {1}
