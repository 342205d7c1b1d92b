"""Tasks that keep their results, run by the tests in-process (``drain``) and by worker
subprocesses (``tests.apps.results:queue``)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from sa_jobqueue import JobContext, JobQueue

metadata = sa.MetaData()
notes = sa.Table("result_notes", metadata, sa.Column("job_id", sa.BigInteger, primary_key=True))

queue = JobQueue(default_queue="results")


@queue.task(keep_result=True)
def add(ctx: JobContext, payload: Any) -> Any:
    """Writes nothing: completed in the worker's batch, with the sum as its result."""
    return {"sum": payload["a"] + payload["b"], "parts": [payload["a"], payload["b"]]}


@queue.task(keep_result=True)
def noted(ctx: JobContext, payload: Any) -> Any:
    """Writes through ctx.session: completed in its own transaction, result and row together."""
    ctx.session.execute(notes.insert().values(job_id=ctx.job_id))
    return payload["n"] * 2


@queue.task(keep_result=True)
def nothing(ctx: JobContext, payload: Any) -> None:
    """Returns None: stored as JSON null."""


@queue.task
def forgetful(ctx: JobContext, payload: Any) -> int:
    """Returns a value its task does not keep."""
    return 42


@queue.task(keep_result=True, max_attempts=1)
def unstorable(ctx: JobContext, payload: Any) -> Any:
    """Writes a row, then returns what JSON cannot carry: the attempt fails, the row goes."""
    ctx.session.execute(notes.insert().values(job_id=ctx.job_id))
    return {1, 2, 3}


@queue.task(keep_result=True, max_attempts=5)
def oversized(ctx: JobContext, payload: Any) -> Any:
    """Returns a result over the queue's size cap: no later attempt could store it either."""
    return "x" * (queue.max_payload_bytes + 1)


@queue.task(keep_result=True, max_attempts=1)
def broken(ctx: JobContext, payload: Any) -> Any:
    raise RuntimeError("no result today")


@queue.task(keep_result=True)
async def later(ctx: JobContext, payload: Any) -> Any:
    """An async handler's result."""
    return [payload["n"], "async"]
