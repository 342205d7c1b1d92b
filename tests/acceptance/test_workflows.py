"""Chains, groups and chords, declared in one call in the caller's transaction, with each
step reading what the jobs it waited for returned."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from sa_jobqueue import JobContext, JobQueue
from sa_jobqueue.errors import InvalidJobError
from sa_jobqueue.models import dependencies_table, jobs_table
from sa_jobqueue.testing import drain
from sa_jobqueue.workflows import Call
from tests.helpers.processes import run_cli

j = jobs_table.c
e = dependencies_table.c


def make_queue() -> JobQueue:
    queue = JobQueue(default_queue="flows")

    @queue.task(keep_result=True)
    def plus_one(ctx: JobContext, payload: Any) -> int:
        before = list(ctx.upstream_results().values())
        start = before[0] if before and before[0] is not None else (payload or {}).get("start", 0)
        return int(start) + 1

    @queue.task(keep_result=True, max_attempts=2)
    def fails(ctx: JobContext, payload: Any) -> int:
        raise RuntimeError("this step always fails")

    @queue.task(keep_result=True)
    def square(ctx: JobContext, payload: Any) -> int:
        return int(payload["n"]) ** 2

    @queue.task(keep_result=True)
    def total(ctx: JobContext, payload: Any) -> int:
        return sum(ctx.upstream_results().values())

    return queue


def statuses_of(engine: sa.Engine, ids: list[int]) -> list[str]:
    with engine.connect() as conn:
        found = dict(conn.execute(sa.select(j.id, j.status).where(j.id.in_(ids))).all())
    return [found[i] for i in ids]


def result_of(engine: sa.Engine, job_id: int) -> Any:
    with engine.connect() as conn:
        return conn.execute(sa.select(j.result).where(j.id == job_id)).scalar_one()


def test_a_chain_of_50_passes_each_result_to_the_next(engine: sa.Engine) -> None:
    queue = make_queue()
    with Session(engine) as session, session.begin():
        ids = queue.chain(session, [Call("plus_one", {"start": 100})] + [Call("plus_one")] * 49)
    assert statuses_of(engine, ids) == ["queued"] + ["waiting"] * 49
    assert drain(queue, engine).succeeded == 50
    assert [result_of(engine, i) for i in ids] == list(range(101, 151))


@pytest.mark.parametrize("on_failure", ["cancel", "run"])
def test_a_failing_middle_step_retries_then_dies(engine: sa.Engine, on_failure: Any) -> None:
    queue = make_queue()
    calls = [Call("plus_one")] * 10 + [Call("fails")] + [Call("plus_one")] * 10
    with Session(engine) as session, session.begin():
        ids = queue.chain(session, calls, on_failure=on_failure)
    outcome = drain(queue, engine, with_retries=True)
    with engine.connect() as conn:
        attempts = conn.execute(sa.select(j.attempts).where(j.id == ids[10])).scalar_one()
    assert attempts == 2  # retried once, then dead
    after = statuses_of(engine, ids[11:])
    assert statuses_of(engine, ids[:11]) == ["succeeded"] * 10 + ["dead"]
    if on_failure == "cancel":
        assert after == ["cancelled"] * 10
        assert outcome.succeeded == 10
    else:
        assert after == ["succeeded"] * 10
        # The step after the dead one found no result, and started again from 0.
        assert [result_of(engine, i) for i in ids[11:]] == list(range(1, 11))


def test_a_group_goes_in_by_batches_and_runs_side_by_side(engine: sa.Engine) -> None:
    queue = make_queue()
    calls = [Call("square", {"n": n}) for n in range(250)] + [Call("plus_one", {"start": 1})]
    with Session(engine) as session, session.begin():
        ids = queue.group(session, calls)
    assert len(ids) == 251
    assert statuses_of(engine, ids) == ["queued"] * 251
    drain(queue, engine)
    assert [result_of(engine, i) for i in ids[:3]] == [0, 1, 4]
    assert result_of(engine, ids[-1]) == 2


@pytest.mark.slow
def test_a_chord_of_2000_calls_back_once_with_every_result(engine: sa.Engine) -> None:
    queue = make_queue()
    with Session(engine) as session, session.begin():
        *_, callback = queue.chord(
            session, [Call("square", {"n": n}) for n in range(2000)], Call("total")
        )
    assert statuses_of(engine, [callback]) == ["waiting"]
    with engine.connect() as conn:  # its members are new: no second look at them on commit
        rechecked = conn.execute(
            sa.select(sa.func.count()).where(e.job_id == callback, e.recheck)
        ).scalar_one()
    assert rechecked == 0
    assert drain(queue, engine).succeeded == 2001
    assert result_of(engine, callback) == sum(n * n for n in range(2000))


def test_a_call_with_an_unknown_option_is_refused(engine: sa.Engine) -> None:
    queue = make_queue()
    with (
        Session(engine) as session,
        session.begin(),
        pytest.raises(InvalidJobError, match="not colour"),
    ):
        queue.chain(session, [Call("plus_one", options={"colour": "red"})])


def test_a_burst_worker_runs_what_its_last_completions_release(
    engine: sa.Engine, database_url: Any
) -> None:
    """The steps write nothing, so each completes in the worker's batch: a burst worker must
    not stop before that batch is written, since it releases the next step."""
    from tests.apps.results import queue as results_queue

    with Session(engine) as session, session.begin():
        ids = results_queue.chain(session, [Call("add", {"a": n, "b": 1}) for n in range(5)])
    url = database_url.render_as_string(hide_password=False)
    done = run_cli("worker", "tests.apps.results:queue", "--burst", "--database-url", url)
    assert done.returncode == 0, done.stderr
    assert statuses_of(engine, ids) == ["succeeded"] * 5


def test_workflows_from_an_async_session(engine: sa.Engine, database_url: Any) -> None:
    import asyncio

    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    queue = make_queue()

    async def declare() -> tuple[list[int], int]:
        async_engine = create_async_engine(database_url)
        try:
            async with AsyncSession(async_engine) as session, session.begin():
                steps = await queue.achain(session, [Call("plus_one", {"start": 1})] * 2)
                *members, callback = await queue.achord(
                    session, [Call("square", {"n": n}) for n in range(3)], Call("total")
                )
                await queue.agroup(session, [Call("square", {"n": 9})])
        finally:
            await async_engine.dispose()
        return [*steps, *members], callback

    ids, callback = asyncio.run(declare())
    assert drain(queue, engine).succeeded == 7
    assert result_of(engine, ids[1]) == 3
    assert result_of(engine, callback) == 0 + 1 + 4
