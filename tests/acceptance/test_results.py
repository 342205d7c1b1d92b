"""Stored results: kept with the fenced completion on every completion path, read back in a
session, waited for (woken by NOTIFY, with a poll fallback and a timeout), from asyncio too,
and by a real worker subprocess's jobs."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import Session

from sa_jobqueue import JobResult, results
from sa_jobqueue._sql import claiming, transitions
from sa_jobqueue.database import create_engine
from sa_jobqueue.errors import (
    InvalidJobError,
    JobFailedError,
    ResultTimeoutError,
    TaskDefinitionError,
    UnknownJobError,
)
from sa_jobqueue.models import jobs_table
from sa_jobqueue.ops import set_queue_concurrency
from sa_jobqueue.testing import drain
from tests.apps import results as app
from tests.apps.results import notes, queue
from tests.helpers.jobs import statuses
from tests.helpers.processes import WorkerApp, Workers, run_cli
from tests.helpers.waiting import wait_for

TABLES = app.metadata
WORKER_APP = WorkerApp("tests.apps.results:queue", log_level="WARNING")
j = jobs_table.c


def enqueue(engine: sa.Engine, task: str, payload: Any = None) -> int:
    with Session(engine) as session, session.begin():
        return int(queue.enqueue(session, task, payload if payload is not None else {}))


def stored(engine: sa.Engine, job_id: int) -> Any:
    with engine.connect() as conn:
        return conn.execute(sa.select(j.result).where(j.id == job_id)).scalar_one()


def noted(engine: sa.Engine) -> set[int]:
    with engine.connect() as conn:
        return set(conn.execute(sa.select(notes.c.job_id)).scalars())


# -- stored with the completion ------------------------------------------------------------------


def test_each_completion_path_stores_what_the_handler_returned(tables: sa.Engine) -> None:
    engine = tables
    batched = enqueue(engine, "add", {"a": 2, "b": 3})
    # Enough writing jobs that the worker starts grouping them into one transaction.
    writing = [enqueue(engine, "noted", {"n": n}) for n in range(30)]
    none = enqueue(engine, "nothing")
    not_kept = enqueue(engine, "forgetful")
    awaited = enqueue(engine, "later", {"n": 7})
    assert drain(queue, engine).succeeded == 34

    assert stored(engine, batched) == {"sum": 5, "parts": [2, 3]}
    assert [stored(engine, job_id) for job_id in writing] == [n * 2 for n in range(30)]
    assert noted(engine) == set(writing)
    assert stored(engine, awaited) == [7, "async"]
    with engine.connect() as conn:
        # JSON null for a handler that returned None; SQL NULL for a task that keeps none.
        kept_null = conn.execute(
            sa.select(j.result.is_not(None), sa.func.jsonb_typeof(j.result)).where(j.id == none)
        ).one()
        assert tuple(kept_null) == (True, "null")
        assert conn.execute(sa.select(j.result.is_(None)).where(j.id == not_kept)).scalar_one()
    with Session(engine) as session:
        assert queue.get_result(session, batched) == JobResult(
            batched, "succeeded", {"sum": 5, "parts": [2, 3]}
        )
        assert queue.get_result(session, writing[3]) == JobResult(writing[3], "succeeded", 6)
        assert queue.get_job(session, batched).result == {"sum": 5, "parts": [2, 3]}  # type: ignore[union-attr]
        assert queue.get_result(session, 10**12) is None


def test_a_result_that_cannot_be_stored_fails_the_attempt_and_its_writes(
    tables: sa.Engine,
) -> None:
    engine = tables
    job_id = enqueue(engine, "unstorable")
    outcome = drain(queue, engine)
    assert outcome.dead == 1
    assert "keeps its result, which cannot be stored" in outcome.errors[job_id]
    assert "UnstorableResultError" in outcome.errors[job_id]
    assert stored(engine, job_id) is None
    assert noted(engine) == set()  # the handler's row rolled back with the attempt
    with Session(engine) as session:
        result = queue.get_result(session, job_id)
    assert result is not None
    assert result.status == "dead"
    with pytest.raises(JobFailedError, match=r"is dead, with no result: .*UnstorableResultError"):
        result.get()


def test_a_result_over_the_size_cap_fails_the_job_at_once_without_retries(
    tables: sa.Engine,
) -> None:
    # Storing the result is deterministic: the next attempt's would be refused just the same.
    engine = tables
    job_id = enqueue(engine, "oversized")
    outcome = drain(queue, engine)
    assert outcome.dead == 1
    with engine.connect() as conn:
        row = conn.execute(
            sa.select(jobs_table.c.status, jobs_table.c.attempts, jobs_table.c.last_error).where(
                jobs_table.c.id == job_id
            )
        ).one()
    assert (row.status, row.attempts) == ("dead", 1)
    assert row.last_error["type"] == "sa_jobqueue.errors.UnstorableResultError"
    assert row.last_error["message"] == (
        f"task 'oversized' keeps its result, which cannot be stored: result is"
        f" {queue.max_payload_bytes + 3} bytes of JSON, over the limit of {queue.max_payload_bytes}"
    )


def test_a_stale_attempt_stores_no_result(tables: sa.Engine) -> None:
    engine = tables
    ids = [enqueue(engine, "add", {"a": n, "b": n}) for n in range(2)]
    with engine.begin() as conn:
        params = {"from_queue": "results", "limit": 2, "worker": "w"}
        claimed = {row.id: row.attempts for row in conn.execute(claiming.claim(), params)}
    assert set(claimed) == set(ids)
    with engine.begin() as conn:
        stale = {**{"job_id": ids[0], "attempt": claimed[ids[0]] + 1}, "result": "1"}
        assert conn.execute(transitions.complete(), stale).rowcount == 0
        batch = {
            "job_ids": ids,
            "attempt_list": [claimed[ids[0]] + 1, claimed[ids[1]]],  # the first one is stale
            "results": f'{{"{ids[0]}": "stale", "{ids[1]}": "fresh"}}',
        }
        assert [row.id for row in conn.execute(transitions.complete_many(), batch)] == [ids[1]]
    assert (stored(engine, ids[0]), stored(engine, ids[1])) == (None, "fresh")


def test_keep_result_must_be_a_bool() -> None:
    with pytest.raises(TaskDefinitionError, match="keep_result must be True or False"):
        queue.task(name="bad_keep", keep_result="yes")(lambda ctx, payload: None)  # type: ignore[arg-type]


# -- waiting -------------------------------------------------------------------------------------


def claim_one(engine: sa.Engine) -> tuple[int, int]:
    with engine.begin() as conn:
        params = {"from_queue": "results", "limit": 1, "worker": "w"}
        row = conn.execute(claiming.claim(), params).one()
    return row.id, row.attempts


def complete(engine: sa.Engine, job_id: int, attempt: int, result: str) -> float:
    """Complete the attempt as a worker's batch does; the moment (monotonic) it committed."""
    with engine.begin() as conn:
        params = {
            "job_ids": [job_id],
            "attempt_list": [attempt],
            "results": f'{{"{job_id}": {result}}}',
        }
        assert len(conn.execute(transitions.complete_many(), params).all()) == 1
    return time.monotonic()


def waiting_for_notify(engine: sa.Engine) -> bool:
    """Whether a wait has done its first read and now waits (its connection idle after it)."""
    with engine.connect() as conn:
        return bool(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle'"
                    " AND query LIKE 'SELECT sa_jobqueue_jobs.id, sa_jobqueue_jobs.status%'"
                )
            ).scalar_one()
        )


class Waiter:
    """Runs a wait on a thread; what it returned or raised, and when (monotonic)."""

    def __init__(self, wait: Callable[[], Any]) -> None:
        self.outcome: Any = None
        self.ended_at = 0.0
        self.thread = threading.Thread(target=self._run, args=(wait,))
        self.thread.start()

    def _run(self, wait: Callable[[], Any]) -> None:
        try:
            self.outcome = wait()
        except Exception as exc:
            self.outcome = exc
        self.ended_at = time.monotonic()

    def join(self) -> Any:
        self.thread.join(30)
        assert not self.thread.is_alive()
        return self.outcome


def test_a_wait_returns_within_50_ms_of_the_commit_woken_by_its_notify(
    engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No poll could wake it in time: only the completion's NOTIFY can.
    monkeypatch.setattr(results, "POLL_EVERY", 5.0)
    job_id = enqueue(engine, "add", {"a": 1, "b": 1})
    job_id, attempt = claim_one(engine)
    waiter = Waiter(lambda: queue.wait_for_result(engine, job_id, timeout=20))
    wait_for(lambda: waiting_for_notify(engine), timeout=10)
    committed = complete(engine, job_id, attempt, "[1, 1]")
    outcome = waiter.join()
    assert outcome == JobResult(job_id, "succeeded", [1, 1])
    assert waiter.ended_at - committed < 0.05, waiter.ended_at - committed


def test_an_end_without_a_notify_is_found_by_the_poll(
    engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(results, "POLL_EVERY", 0.2)
    job_id = enqueue(engine, "broken")
    waiter = Waiter(lambda: queue.wait_for_result(engine, job_id, timeout=20))
    wait_for(lambda: waiting_for_notify(engine), timeout=10)
    assert drain(queue, engine).dead == 1  # a dead job sends no NOTIFY
    outcome = waiter.join()
    assert isinstance(outcome, JobResult)
    assert outcome.status == "dead"
    with pytest.raises(JobFailedError, match="RuntimeError: no result today"):
        outcome.get()


def test_a_wait_times_out_cleanly_and_gives_its_connection_back(database_url: URL) -> None:
    engine = create_engine(database_url, pool_size=1, max_overflow=0)
    try:
        job_id = enqueue(engine, "add", {"a": 1, "b": 2})
        started = time.monotonic()
        with pytest.raises(ResultTimeoutError, match=f"job {job_id} had not ended after 0.3 s"):
            queue.wait_for_result(engine, job_id, timeout=0.3)
        assert 0.3 <= time.monotonic() - started < 2
        assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
        with engine.connect() as conn:  # the same connection, the pool's only one
            assert (
                conn.execute(sa.text("SELECT count(*) FROM pg_listening_channels()")).scalar() == 0
            )
        with pytest.raises(UnknownJobError, match="no job with id 999999"):
            queue.wait_for_result(engine, 999999, timeout=5)
        with pytest.raises(InvalidJobError):
            queue.wait_for_result(engine, job_id, timeout=0)
        with pytest.raises(InvalidJobError):
            queue.wait_for_result(engine, [], timeout=1)
    finally:
        engine.dispose()


def test_a_wait_for_a_group_returns_every_outcome_in_order(tables: sa.Engine) -> None:
    engine = tables
    ids = [enqueue(engine, "add", {"a": n, "b": 1}) for n in range(5)]
    failing = enqueue(engine, "broken")
    group = [*ids, failing]
    waiter = Waiter(lambda: queue.wait_for_result(engine, group, timeout=20))
    drain(queue, engine)
    outcomes = waiter.join()
    assert [o.job_id for o in outcomes] == group
    assert [o.get()["sum"] for o in outcomes[:5]] == [n + 1 for n in range(5)]
    assert outcomes[5].status == "dead"


def test_a_wait_from_asyncio(database_url: URL, engine: sa.Engine) -> None:
    job_id = enqueue(engine, "add", {"a": 20, "b": 22})

    async def main() -> JobResult:
        async_engine = create_async_engine(database_url)
        try:
            waiting = asyncio.ensure_future(queue.await_result(async_engine, job_id, timeout=20))
            await asyncio.sleep(0)  # the wait starts before the job runs
            await asyncio.to_thread(drain, queue, engine)
            return await waiting
        finally:
            await async_engine.dispose()

    assert asyncio.run(main()).get() == {"sum": 42, "parts": [20, 22]}


# -- a real worker ---------------------------------------------------------------------------


def test_results_of_a_worker_subprocess(tables: sa.Engine, workers: Workers) -> None:
    engine = tables
    ids = [enqueue(engine, "add", {"a": n, "b": n}) for n in range(50)]
    workers.start(concurrency=4)
    outcomes = queue.wait_for_result(engine, ids, timeout=60)
    assert [o.get()["sum"] for o in outcomes] == [2 * n for n in range(50)]
    assert statuses(engine, ids) == {"succeeded": 50}


def test_results_of_a_capped_queue_whose_completions_claim_the_next_jobs(
    tables: sa.Engine,
) -> None:
    engine = tables
    with engine.begin() as conn:
        set_queue_concurrency(conn, "results", 2)
    ids = [enqueue(engine, "add", {"a": n, "b": 0}) for n in range(10)]
    assert drain(queue, engine).succeeded == 10
    assert [stored(engine, job_id)["sum"] for job_id in ids] == list(range(10))


def test_jobs_show_prints_the_result(tables: sa.Engine, database_url: URL) -> None:
    job_id = enqueue(tables, "add", {"a": 4, "b": 5})
    plain = enqueue(tables, "forgetful")
    drain(queue, tables)
    url = database_url.render_as_string(hide_password=False)
    shown = run_cli("jobs", "show", str(job_id), "--database-url", url)
    assert shown.returncode == 0, shown.stderr
    assert 'result:       {"sum": 9, "parts": [4, 5]}' in shown.stdout.splitlines()
    shown = run_cli("jobs", "show", str(plain), "--database-url", url)
    assert not any(line.startswith("result:") for line in shown.stdout.splitlines())
