"""Writing successes: with the handler's writes, with its group's commit, in a batch, or in a
batch that also claims the next jobs of a limited queue (:class:`HandOff`).

Every completion is fenced on ``(job id, attempt)``: a stale attempt's completion matches no
row and changes nothing. A success is written in the handler's own transaction when the
handler wrote through its session (its writes and the completion commit together), with its
group's commit when it ran in one, and otherwise in a batch with other jobs' (see
:mod:`~sa_jobqueue.worker._completer`), which also claims the successors of jobs that held
slots of a limited queue (see ``HandOff``).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from itertools import repeat
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from .._binds import transient
from .._deadlines import StopClock
from .._error_text import one_line
from .._payloads import encode_payload
from .._sql import claim_limits, transitions
from .._sql.fence import held_many
from ..database import HeldConnection
from ..errors import PayloadError, UnstorableResultError
from ..tasks import Task
from ._claimed import Claimed
from ._claimer import LimitedQueues, limited_jobs, runnable
from ._completer import Completer, Flushed
from ._reports import Reports
from ._retries import RECORD_RETRY
from ._sessions import HandlerSession, deadline
from ._settlement import Outcome

if TYPE_CHECKING:
    from sqlalchemy import CursorResult
    from sqlalchemy.ext.asyncio import AsyncSession

    from ._lanes import Lane

log = logging.getLogger("sa_jobqueue.worker")

_Key = tuple[int, int]  # (job id, attempt)


def encode_result(task: Task, value: object, max_bytes: int) -> str | None:
    """What a handler returned, as the JSON text its completion stores, if its task keeps
    results (None otherwise). A value payloads could not carry raises UnstorableResultError (a
    PayloadError; the job goes to dead at once, as no attempt could store it)."""
    if not task.keep_result:
        return None
    try:
        return encode_payload(value, max_bytes=max_bytes)
    except PayloadError as exc:
        # Every message of encode_payload starts with "payload": here it is the result.
        why = str(exc).removeprefix("payload")
        raise UnstorableResultError(
            f"task {task.name!r} keeps its result, which cannot be stored: result{why}"
        ) from None


def complete_in_transaction(
    session: HandlerSession, job_id: int, attempt: int, result: str | None
) -> bool:
    """The fenced completion in a handler's own transaction, committed with its writes if it
    matched; whether it did (if not, the caller rolls the writes back). The one statement a
    job thread (under its deadline) and a hard-limited attempt's child (in its own process,
    killed at its limit) complete with."""
    params = {"job_id": job_id, "attempt": attempt, "result": result}
    done = session.connection().execute(transitions.complete(), params).rowcount == 1
    if done:
        session.commit_for_real()
    return done


class HeldResults:
    """What handlers of tasks that keep results returned (JSON text), per attempt, until the
    attempt's completion statement takes it; dropped when the attempt ends otherwise."""

    def __init__(self) -> None:
        self._held: dict[_Key, str] = {}

    def keep(self, job: Claimed, task: Task, value: object, max_bytes: int) -> None:
        """A task that keeps results: hold what its handler returned, as JSON, for the
        completion to store. A value payloads could not carry raises UnstorableResultError (a
        PayloadError; the job goes to dead at once, as no attempt could store it)."""
        text = encode_result(task, value, max_bytes)
        if text is not None:
            self._held[(job.id, job.attempts)] = text

    def keep_encoded(self, job: Claimed, text: str | None) -> None:
        """Hold a result already encoded (by :func:`encode_result`, elsewhere)."""
        if text is not None:
            self._held[(job.id, job.attempts)] = text

    def take(self, job_id: int, attempt: int) -> str | None:
        """The attempt's result, if it has one; forgotten here."""
        return self._held.pop((job_id, attempt), None) if self._held else None

    def of_many(self, batch: Iterable[_Key]) -> str:
        """The batch's results as one JSON object from job id to result (``{}``: none), kept
        here (see :meth:`forget_many`)."""
        if not self._held:
            return "{}"
        found = ((job_id, self._held.get((job_id, attempt))) for job_id, attempt in batch)
        return "{" + ",".join(f'"{job_id}":{text}' for job_id, text in found if text) + "}"

    def forget_many(self, batch: Iterable[_Key]) -> None:
        """Forget the results of ``batch``'s attempts."""
        if self._held:
            for key in batch:
                self._held.pop(key, None)

    def take_many(self, batch: Iterable[_Key]) -> str:
        """The batch's results as one JSON object from job id to result (``{}``: none);
        forgotten here."""
        if not self._held:
            return "{}"
        pairs = list(batch)
        text = self.of_many(pairs)
        self.forget_many(pairs)
        return text


class Successes:
    """Writes successes, each with its fenced statement; owns the batching :class:`Completer`.

    ``not_completed`` settles a batched completion that matched no row; ``handoff``, if given,
    claims the successors of completed jobs that held slots of a limited queue in the batch's
    own statement. What it does not promise: that a batched completion is written (see
    :meth:`close`); a job whose completion is lost runs again after its lease.
    """

    def __init__(
        self,
        single: Engine,
        reports: Reports,
        not_completed: Callable[[int, int], None],
        *,
        handoff: HandOff | None = None,
        on_flushed: Callable[[], None] | None = None,
        clock: StopClock | None = None,
    ) -> None:
        self._reports = reports
        self._handoff = handoff
        self._batch_conn = HeldConnection(single)  # the completer thread's alone
        #: The results waiting for their attempts' completions.
        self.results = HeldResults()
        # The queue of each slot-holding attempt whose completion waits for its batch.
        self._slots: dict[_Key, str] = {}
        self._slots_lock = threading.Lock()
        self._completer = Completer(
            self._complete_batch,
            not_completed,
            reports.completed,
            reports.unrecorded,
            on_flushed=on_flushed,
            retry_for=RECORD_RETRY,
            retryable=transient,
            clock=clock,
        )

    def pending(self) -> bool:
        """Whether completions wait for their batch (see ``Completer.pending``)."""
        return self._completer.pending()

    def close(self, timeout: float | None = None) -> int:
        """Flush the completions still waiting for their batch; how many were still not
        written after ``timeout`` seconds (left to their leases)."""
        unwritten = self._completer.close(timeout)
        if not unwritten:
            self._batch_conn.close()
        return unwritten

    def batch(self, job: Claimed) -> None:
        """Complete an attempt that wrote nothing in the next batch, with other jobs'."""
        if job.holds_slot:
            # The slot of the queue's cap is free once this commits: the job's thread, and so
            # its lane's next claim, waits for that (the lease covers the wait). The batch
            # claims the slot's next job as it commits (see HandOff).
            with self._slots_lock:
                self._slots[(job.id, job.attempts)] = job.queue
            self._completer.add_and_wait(job.id, job.attempts, job.lease.total_seconds())
        else:
            self._completer.add(job.id, job.attempts)

    def try_batch(self, job: Claimed) -> bool:
        """:meth:`batch` if it would not wait; False (nothing queued) if it would: the job
        holds a slot of a queue's cap (its completion is waited for), or the batches are held
        back (see ``Completer.try_add``)."""
        return not job.holds_slot and self._completer.try_add(job.id, job.attempts)

    def complete_in(self, session: HandlerSession, job: Claimed) -> bool:
        """The fenced completion in the handler's own transaction, committed with its writes.

        False if it matched no row (cancelled, or no longer this worker's): the caller rolls
        the session back and records Abandon.
        """
        with deadline(session.connection()):
            done = complete_in_transaction(session, job.id, job.attempts, self._result(job))
        if done:
            self._reports.report(job.id, job.attempts, Outcome.SUCCEEDED)
            log.debug("job %d (%s) attempt %d succeeded", job.id, job.task, job.attempts)
        return done

    async def complete_in_async(self, session: AsyncSession, job: Claimed) -> bool:
        """:meth:`complete_in`, for an async handler's session."""
        params = {"job_id": job.id, "attempt": job.attempts, "result": self._result(job)}

        def complete(sync: Session) -> bool:
            # The statement and the commit in one pass on the session's sync side: one hop
            # into SQLAlchemy's greenlet, not one each.
            done = sync.connection().execute(transitions.complete(), params).rowcount == 1
            if done:
                cast(HandlerSession, sync).commit_for_real()
            return done

        if not await session.run_sync(complete):
            return False
        self._reports.report(job.id, job.attempts, Outcome.SUCCEEDED)
        return True

    def complete_group(self, conn: Connection, jobs: list[Claimed]) -> set[int]:
        """Complete a group's jobs on its shared connection; the ids that matched."""
        if not jobs:
            return set()
        pairs = [(j.id, j.attempts) for j in jobs]
        params = {**held_many(pairs), "results": self.results.take_many(pairs)}
        return set(conn.execute(transitions.complete_many(), params).scalars())

    async def complete_group_async(self, session: AsyncSession, jobs: list[Claimed]) -> set[int]:
        """:meth:`complete_group` in an async handler's session (a batch's, on the event loop),
        committed if all matched and rolled back otherwise; the ids that matched."""
        pairs = [(job.id, job.attempts) for job in jobs]
        params = {**held_many(pairs), "results": self.results.take_many(pairs)}
        result = await session.execute(transitions.complete_many(), params)
        done = set(cast("CursorResult[Any]", result).scalars())
        if len(done) == len(jobs):
            await session.run_sync(lambda sync: cast(HandlerSession, sync).commit_for_real())
        else:
            await session.rollback()
        return done

    def _result(self, job: Claimed) -> str | None:
        return self.results.take(job.id, job.attempts)

    def _complete_batch(self, batch: list[_Key], *, wait: bool) -> set[int] | Flushed:
        """Complete a batch of attempts that wrote nothing (on the completer's thread).

        When some of them hold slots of a limited queue, the statement also claims as many of
        that queue's jobs (the one with the most, if several), within its limits. Otherwise,
        unless ``wait``, rows that another transaction holds locked are not waited for: they
        come back busy, to be tried again (see ``transitions.complete_many_unless_locked``).
        """
        freed: Counter[str] = Counter()
        if self._slots:  # only jobs of limited queues are noted there
            with self._slots_lock:
                freed.update(q for q in map(self._slots.pop, batch, repeat(None)) if q is not None)
        if freed and self._handoff is not None:
            results = self.results.take_many(batch)
            queue, n = freed.most_common(1)[0]
            try:
                return self._handoff.complete(self._batch_conn, batch, results, queue, n)
            except SQLAlchemyError as exc:  # completed below, without the claim
                log.warning("completing and claiming in one failed: %s", one_line(exc))
            wait = True  # its results are taken: no try may leave any for later
        else:
            results = self.results.of_many(batch)
        statement = (
            transitions.complete_many() if wait else transitions.complete_many_unless_locked()
        )
        rows = self._batch_conn.rows(
            statement,
            {**held_many(batch), "results": results},
            # A connection lost on the way (a silent network cut at its deadline) most likely
            # never delivered the statement: try once more on a fresh one rather than leave
            # the jobs to run again after their leases.
            again=True,
        )
        if wait:
            self.results.forget_many(batch)
            return {row.id for row in rows}
        (row,) = rows
        locked = set(row.locked)
        again = [pair for pair in batch if pair[0] not in locked]
        self.results.forget_many(pair for pair in batch if pair[0] in locked)
        return Flushed(set(row.done), again)


class HandOff:
    """Completes jobs that hold slots of a limited queue and claims their successors, in one
    statement (``claim_limits.claim_limited(completing=True)``) on the completer's connection.

    Without it, a slot freed by a completion waits for the completion's commit, then for the
    claim loop to wake and claim: two round trips, and a thread hand-over each way, between
    one job of a capped queue and the next. Here the completion and the next claim commit
    together (durably, as the completion alone would), for as many jobs as the batch freed
    threads of that queue's lane; the jobs claimed go to the lane's buffer, where the freed
    threads take them. A shutdown under way claims nothing (the completions still go).
    """

    def __init__(
        self,
        worker: str,
        limited: LimitedQueues,
        lanes: Callable[[str], Lane],
        submit: Callable[[Lane, Claimed], None],
        stopping: threading.Event,
    ) -> None:
        self._worker = worker
        self._limited = limited
        self._lanes = lanes
        self._submit = submit
        self._stopping = stopping

    def complete(
        self,
        conn: HeldConnection,
        batch: list[tuple[int, int]],
        results: str,
        queue: str,
        freed: int,
    ) -> set[int]:
        """Complete ``batch`` (fenced; ``results`` as ``transitions.complete_many`` takes them),
        and claim up to ``freed`` jobs of ``queue`` in the same statement; the ids completed.
        The jobs claimed are submitted to the queue's lane."""
        lane = self._lanes(queue)
        params = {
            "from_queue": queue,
            "limit": 0 if self._stopping.is_set() else freed,
            "worker": self._worker,
            **held_many(batch),
            "results": results,
        }
        statement = claim_limits.claim_limited(keyed=self._limited.keyed(queue), completing=True)
        rows = conn.rows(statement, params)
        for job in limited_jobs(rows):
            if runnable(job):
                self._submit(lane, job)
        return set(rows[0].completed)
