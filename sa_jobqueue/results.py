"""Results: what the handler of a task declared with ``keep_result=True`` returned.

The worker stores the value with the job's fenced completion, in the same statement (a stale
attempt stores nothing), and announces it with a NOTIFY on ``sa_jobqueue_results`` when that
commits. Read it in your own transaction with :meth:`JobQueue.get_result
<sa_jobqueue.JobQueue.get_result>`, or wait for a job (or a group of them) to finish with
:meth:`~sa_jobqueue.JobQueue.wait_for_result` (blocking) or
:meth:`~sa_jobqueue.JobQueue.await_result` (asyncio)::

    @queue.task(keep_result=True)
    def add(ctx, payload):
        return payload["a"] + payload["b"]

    with Session(engine) as session, session.begin():
        job_id = queue.enqueue(session, "add", {"a": 2, "b": 3})
    assert queue.wait_for_result(engine, job_id, timeout=10).get() == 5

A wait listens on its own connection, taken from the engine for as long as it waits and
given back without its LISTEN. It is woken by the completion's NOTIFY, and looks again every
``POLL_EVERY`` seconds whatever it hears: a job that ends dead or cancelled sends none, and a
transaction pooler (``pooler="transaction"``) carries no LISTEN, so there it polls only.
Results live as long as their job rows (see the worker's ``--retention``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import psycopg
from sqlalchemy import Connection, Engine

from ._binds import SessionLike, connection_of
from ._sql import results as results_sql
from ._validation import check_job_id
from .database import pooler_of
from .errors import InvalidJobError, JobFailedError, ResultTimeoutError, UnknownJobError
from .models import CANCELLED, DEAD, SUCCEEDED

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["JobResult"]

#: How often a wait reads its jobs again when no NOTIFY has woken it (seconds).
POLL_EVERY: Final = 0.5
#: The most jobs one wait takes.
MAX_WAIT_JOBS: Final = 100_000

_FINISHED: Final = frozenset({SUCCEEDED, DEAD, CANCELLED})


@dataclass(frozen=True)
class JobResult:
    """A job's outcome as far as it has come: its status, its stored result, its last error.

    ``value`` is what the handler returned (None when the task keeps no result, or until the
    job succeeds); ``error`` is the job's ``last_error`` (why its last attempt failed).
    """

    job_id: int
    status: str
    value: Any = None
    error: Any = None

    @property
    def finished(self) -> bool:
        """Whether the job has ended: succeeded, dead or cancelled."""
        return self.status in _FINISHED

    @property
    def succeeded(self) -> bool:
        return self.status == SUCCEEDED

    def get(self) -> Any:
        """The value, if the job succeeded; :class:`~sa_jobqueue.errors.JobFailedError` if it
        ended dead or cancelled, or has not ended yet."""
        if not self.succeeded:
            raise JobFailedError(self.job_id, self.status, self.error)
        return self.value


def _read(conn: Connection, job_ids: Iterable[int]) -> dict[int, JobResult]:
    rows = conn.execute(results_sql.outcomes(), {"job_ids": list(job_ids)})
    return {row.id: JobResult(row.id, row.status, row.result, row.last_error) for row in rows}


def get_result(session: SessionLike, job_id: int) -> JobResult | None:
    """Job ``job_id``'s outcome as the caller's transaction sees it; None if there is none."""
    (job_id,) = _check_ids([job_id])
    return _read(connection_of(session), [job_id]).get(job_id)


def _check_ids(job_ids: Iterable[object]) -> list[int]:
    ids = [check_job_id(one) for one in job_ids]
    if not 1 <= len(ids) <= MAX_WAIT_JOBS:
        raise InvalidJobError(f"wait for 1 to {MAX_WAIT_JOBS} jobs, not {len(ids)}")
    return ids


def _check_timeout(timeout: float) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise InvalidJobError(f"timeout is a number of seconds above 0, not {timeout!r}")
    return float(timeout)


class _Waiting:
    """What one wait has seen: the jobs still running, and the outcomes of those that ended."""

    def __init__(self, job_ids: list[int], timeout: float) -> None:
        self.ids = job_ids
        self.pending = set(job_ids)
        self.ended: dict[int, JobResult] = {}
        self.deadline = time.monotonic() + timeout
        self.timeout = timeout
        self.first = True

    def saw(self, outcomes: dict[int, JobResult]) -> list[JobResult] | None:
        """Take what a read found; all the outcomes once every job has ended."""
        if self.first:
            missing = self.pending - outcomes.keys()
            if missing:
                raise UnknownJobError(sorted(missing))
            self.first = False
        for job_id, outcome in outcomes.items():
            if outcome.finished:
                self.ended[job_id] = outcome
                self.pending.discard(job_id)
        if not self.pending:
            return [self.ended[job_id] for job_id in self.ids]
        return None

    def left(self) -> float:
        """Seconds until the next read: the poll, or the deadline; ResultTimeoutError past it."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise ResultTimeoutError(sorted(self.pending), self.timeout)
        return min(left, POLL_EVERY)

    def woken(self, payloads: Iterable[str]) -> bool:
        """Whether a notification names one of the jobs still waited for."""
        return any(p.isdigit() and int(p) in self.pending for p in payloads)


def wait_for_results(engine: Engine, job_ids: Sequence[int], timeout: float) -> list[JobResult]:
    """Block until every job of ``job_ids`` has ended; their outcomes, in that order."""
    waiting = _Waiting(_check_ids(job_ids), _check_timeout(timeout))
    listen = pooler_of(engine) != "transaction"
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        driver = conn.connection.driver_connection
        assert isinstance(driver, psycopg.Connection)
        if listen:  # before the first read: a result committed after it still wakes the wait
            driver.execute(results_sql.listen())
        try:
            while (done := waiting.saw(_read(conn, waiting.pending))) is None:
                pause = waiting.left()
                if not listen:
                    time.sleep(pause)
                    continue
                until = time.monotonic() + pause
                while (rest := until - time.monotonic()) > 0:
                    heard = [n.payload for n in driver.notifies(timeout=rest, stop_after=1)]
                    if waiting.woken(heard):
                        break
            return done
        finally:
            if listen and not driver.closed:
                driver.execute(results_sql.unlisten())


async def await_results(
    engine: AsyncEngine, job_ids: Sequence[int], timeout: float
) -> list[JobResult]:
    """:func:`wait_for_results` on an asyncio event loop, with an ``AsyncEngine``."""
    waiting = _Waiting(_check_ids(job_ids), _check_timeout(timeout))
    listen = pooler_of(engine.sync_engine) != "transaction"
    async with engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        raw = await conn.get_raw_connection()
        driver = raw.driver_connection
        assert isinstance(driver, psycopg.AsyncConnection)
        if listen:
            await driver.execute(results_sql.listen())
        try:
            while True:
                outcomes = await conn.run_sync(_read, list(waiting.pending))
                if (done := waiting.saw(outcomes)) is not None:
                    return done
                pause = waiting.left()
                if not listen:
                    await asyncio.sleep(pause)
                    continue
                until = time.monotonic() + pause
                while (rest := until - time.monotonic()) > 0:
                    notes = driver.notifies(timeout=rest, stop_after=1)
                    if waiting.woken([n.payload async for n in notes]):
                        break
        finally:
            if listen and not driver.closed:
                await driver.execute(results_sql.unlisten())
