"""Middleware around enqueue (in the caller's transaction, before the queue's SQL) and around
each attempt (inside it: its writes through ctx.session are exactly-once), composed in order,
for sync and async handlers and enqueues."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from sa_jobqueue import JobContext, JobQueue
from sa_jobqueue.errors import TaskDefinitionError
from sa_jobqueue.middleware import Enqueueing, Middleware, ProceedArun, ProceedEnqueue, ProceedRun
from sa_jobqueue.models import jobs_table
from sa_jobqueue.testing import drain
from sa_jobqueue.workflows import Call

metadata = sa.MetaData()
audit = sa.Table(
    "middleware_audit",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("what", sa.Text, nullable=False),
)
TABLES = metadata
j = jobs_table.c

tenant: contextvars.ContextVar[str] = contextvars.ContextVar("tenant", default="none")


class Refused(Exception):
    pass


class Trace(Middleware):
    """Notes each hook's entry and exit in ``log``, under its name."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self.log = log

    def enqueue(self, call: Enqueueing, proceed: ProceedEnqueue) -> list[Any]:
        self.log.append(f"{self.name} enqueue in")
        ids = proceed(call)
        self.log.append(f"{self.name} enqueue out")
        return ids

    def run(self, ctx: JobContext, payload: Any, proceed: ProceedRun) -> Any:
        self.log.append(f"{self.name} run in")
        value = proceed(ctx, payload)
        self.log.append(f"{self.name} run out")
        return value


class Tenant(Middleware):
    """Tags each payload with the current tenant, refuses the "blocked" one, writes an audit
    row in the caller's transaction; around a run, writes an audit row through ctx.session and
    doubles a numeric result."""

    def enqueue(self, call: Enqueueing, proceed: ProceedEnqueue) -> list[Any]:
        if tenant.get() == "blocked":
            raise Refused("tenant blocked")
        call.connection.execute(audit.insert().values(what=f"enqueue {call.task.name}"))
        tagged = [{**p, "tenant": tenant.get()} for p in call.payloads]
        return proceed(dataclasses.replace(call, payloads=tagged))

    def run(self, ctx: JobContext, payload: Any, proceed: ProceedRun) -> Any:
        ctx.session.execute(audit.insert().values(what=f"run {ctx.job_id}"))
        value = proceed(ctx, payload)
        return value * 2 if isinstance(value, int) else value

    async def arun(self, ctx: JobContext, payload: Any, proceed: ProceedArun) -> Any:
        value = await proceed(ctx, payload)
        return [value, "wrapped"]


def tenant_queue(*layers: Middleware) -> JobQueue:
    queue = JobQueue(default_queue="mw", middleware=layers)

    @queue.task(keep_result=True)
    def echo(ctx: JobContext, payload: Any) -> Any:
        return payload.get("n", payload)

    @queue.task(keep_result=True, max_attempts=1)
    def fails(ctx: JobContext, payload: Any) -> Any:
        raise RuntimeError("handler failed")

    @queue.task(keep_result=True)
    async def later(ctx: JobContext, payload: Any) -> Any:
        return payload["n"]

    return queue


def audit_rows(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(sa.select(audit.c.what).order_by(audit.c.id)).scalars())


def job(engine: sa.Engine, job_id: int) -> Any:
    with engine.connect() as conn:
        return conn.execute(sa.select(j.payload, j.result, j.status).where(j.id == job_id)).one()


def test_enqueue_and_run_pass_through_the_middleware_in_order(tables: sa.Engine) -> None:
    log: list[str] = []
    queue = tenant_queue(Trace("outer", log), Trace("inner", log))
    with Session(tables) as session, session.begin():
        queue.enqueue(session, "echo", {"n": 1})
    assert log == ["outer enqueue in", "inner enqueue in", "inner enqueue out", "outer enqueue out"]
    log.clear()
    assert drain(queue, tables).succeeded == 1
    assert log == ["outer run in", "inner run in", "inner run out", "outer run out"]


def test_enqueue_middleware_changes_payloads_and_writes_in_the_callers_transaction(
    tables: sa.Engine,
) -> None:
    queue = tenant_queue(Tenant())
    token = tenant.set("acme")
    try:
        with Session(tables) as session, session.begin():
            one = queue.enqueue(session, "echo", {"n": 3})
            many = queue.enqueue_many(session, "echo", [{"n": n} for n in range(250)])  # COPY
        with Session(tables) as session, session.begin():
            queue.enqueue(session, "echo", {"n": 9})
            session.rollback()  # the job and the middleware's row go together
    finally:
        tenant.reset(token)
    assert job(tables, one).payload == {"n": 3, "tenant": "acme"}
    assert {job(tables, i).payload["tenant"] for i in many} == {"acme"}
    assert audit_rows(tables) == ["enqueue echo", "enqueue echo"]


def test_enqueue_middleware_can_refuse_and_nothing_is_inserted(tables: sa.Engine) -> None:
    queue = tenant_queue(Tenant())
    token = tenant.set("blocked")
    try:
        with Session(tables) as session, session.begin():
            with pytest.raises(Refused):
                queue.enqueue(session, "echo", {"n": 1})
            # The caller's transaction is still usable.
            session.execute(audit.insert().values(what="after the refusal"))
    finally:
        tenant.reset(token)
    with tables.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(jobs_table)).scalar() == 0
    assert audit_rows(tables) == ["after the refusal"]


class Counting(Middleware):
    """Notes how many statements the test's engine had sent when the enqueue reached it."""

    def __init__(self, sent: list[str], seen: list[int]) -> None:
        self.sent = sent
        self.seen = seen

    def enqueue(self, call: Enqueueing, proceed: ProceedEnqueue) -> list[Any]:
        self.seen.append(len(self.sent))
        if tenant.get() == "blocked":
            raise Refused("tenant blocked")
        return proceed(call)


@pytest.mark.parametrize("how", ["enqueue", "enqueue_many", "chain"])
def test_enqueue_middleware_runs_before_any_sql_with_dependencies(
    tables: sa.Engine, sent_sql: list[str], how: str
) -> None:
    """With ``depends_on`` too: the dependencies are locked (and an unknown one refused) after
    the middleware has run, so a refusal is the middleware's and nothing was sent."""
    seen: list[int] = []
    queue = tenant_queue(Counting(sent_sql, seen))

    def enqueue(session: Session) -> None:
        depends_on = [dep, 10**9]  # the second has no job
        if how == "enqueue":
            queue.enqueue(session, "echo", {"n": 2}, depends_on=depends_on)
        elif how == "enqueue_many":
            queue.enqueue_many(session, "echo", [{"n": 2}], depends_on=depends_on)
        else:
            queue.chain(session, [Call("echo", {"n": 2})], depends_on=depends_on)

    with Session(tables) as session, session.begin():
        dep = queue.enqueue(session, "echo", {"n": 1})
    token = tenant.set("blocked")
    try:
        with Session(tables) as session, session.begin():
            session.execute(sa.select(1))  # the transaction has begun: what follows is ours
            sent_sql.clear()
            seen.clear()
            with pytest.raises(Refused):
                enqueue(session)
            assert seen == [0]
            assert sent_sql == []
    finally:
        tenant.reset(token)


def test_run_middleware_writes_once_with_the_completion_and_changes_the_result(
    tables: sa.Engine,
) -> None:
    queue = tenant_queue(Tenant())
    with Session(tables) as session, session.begin():
        ok = queue.enqueue(session, "echo", {"n": 21})
        queue.enqueue(session, "fails", {})
    outcome = drain(queue, tables)
    assert (outcome.succeeded, outcome.dead) == (1, 1)
    assert job(tables, ok).result == 42  # the middleware doubled what the handler returned
    # Its row commits with the job's completion; with the failed attempt it rolled back.
    assert [r for r in audit_rows(tables) if r.startswith("run")] == [f"run {ok}"]


def test_async_enqueue_and_async_handlers_pass_through_the_middleware(
    tables: sa.Engine, database_url: URL
) -> None:
    queue = tenant_queue(Tenant())

    async def enqueue() -> int:
        async_engine = create_async_engine(database_url)
        try:
            token = tenant.set("async-co")
            try:
                async with AsyncSession(async_engine) as session, session.begin():
                    job_id = await queue.aenqueue(session, "later", {"n": 5})
                    await queue.aenqueue_many(session, "later", [{"n": 6}])
            finally:
                tenant.reset(token)
        finally:
            await async_engine.dispose()
        return job_id

    job_id = asyncio.run(enqueue())
    assert job(tables, job_id).payload == {"n": 5, "tenant": "async-co"}
    assert drain(queue, tables).succeeded == 2
    assert job(tables, job_id).result == [5, "wrapped"]


def test_middleware_must_be_middleware_objects() -> None:
    with pytest.raises(TaskDefinitionError, match="middleware must be Middleware objects"):
        JobQueue(middleware=[object()])  # type: ignore[list-item]
