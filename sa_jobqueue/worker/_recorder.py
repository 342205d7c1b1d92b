"""The one place that writes an attempt's outcome, and tells the observers what was written.

Each :data:`~sa_jobqueue.worker._settlement.Verdict` has its statement here, and every
statement is fenced on ``(job id, attempt)``: a stale attempt's write matches no row and
changes nothing. A success is written in the handler's own transaction when the handler
wrote through its session (its writes and the completion commit together), in a batch with
other jobs' when it did not, or with its group's commit.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from itertools import repeat
from typing import TYPE_CHECKING, Any, TypeVar, cast

from sqlalchemy import Connection, CursorResult, Engine, Row
from sqlalchemy.exc import SQLAlchemyError

from .._binds import transient
from .._deadlines import StopClock
from .._error_text import error_json, one_line
from .._sql import leases as leases_sql
from .._sql import transitions
from .._sql.fence import held_many
from ..database import HeldConnection
from ..models import CANCELLED, DEAD
from ..observability import JobRun, Observers
from ..tasks import Backoff, Retry, Task
from ._claimed import Claimed, policy, retry_delay, unknown_task_policy
from ._completer import Completer, retry_with_backoff
from ._sessions import HandlerSession, deadline
from ._settlement import (
    ABANDON,
    Abandon,
    Bury,
    Complete,
    Fail,
    Outcome,
    Release,
    Snooze,
    Verdict,
    outcome_of,
)

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from ._claimer import HandOff

log = logging.getLogger("sa_jobqueue.worker")

#: Why a job stopped part-way by its worker's shutdown went back to the queue.
SHUTDOWN_RELEASE = "stopped part-way by the worker's shutdown"

_Key = tuple[int, int]  # (job id, attempt)
T = TypeVar("T")

#: How long an outcome whose statement failed on a transient error (a lost connection, a
#: refused one: "too many clients", a restart) is tried again before the worker gives up and
#: leaves the job to its lease (seconds). Within the default 30 s lease, so the retry is done
#: while the job is still this worker's; a try after a shorter lease ran out is fenced.
RECORD_RETRY = 10.0


def retrying(write: Callable[[], T], what: str, clock: StopClock | None = None) -> T:
    """Run ``write`` (one fenced statement, safe to repeat), again with backoff on a transient
    error for up to RECORD_RETRY seconds (less once a stopping worker must be gone, by
    ``clock``); then raise. It runs on the job's thread, which keeps its slot meanwhile: a
    worker that cannot write its outcomes claims no more jobs."""

    def first_failure(exc: Exception) -> None:
        log.warning("%s: %s; retrying for up to %g s", what, one_line(exc), RECORD_RETRY)

    return retry_with_backoff(write, RECORD_RETRY, transient, first_failure, clock)


class Reports:
    """Tells the observers each attempt's outcome once, with its handler's run time.

    An attempt waits here from its handler's return until its outcome is recorded (a batched
    completion, a group's commit). A timeout the heartbeat records may come first: then the
    attempt was reported with it, and the handler's later return reports nothing.
    """

    def __init__(self, observe: Observers) -> None:
        self.observe = observe
        self._lock = threading.Lock()  # between a handler's return and its timeout
        self._settling: dict[_Key, tuple[JobRun, float | None]] = {}
        self._timed_out: set[_Key] = set()

    def ran(self, job: Claimed, run: JobRun, elapsed: float | None) -> None:
        """The handler returned or raised after ``elapsed`` seconds (None: it never ran)."""
        key = (job.id, job.attempts)
        with self._lock:
            if key in self._timed_out:
                self._timed_out.discard(key)  # its outcome was reported with its timeout
            else:
                self._settling[key] = (run, elapsed)

    def report(
        self, job_id: int, attempt: int, outcome: Outcome, error: BaseException | None = None
    ) -> None:
        """Tell the observers an attempt's outcome (once: later reports find nothing)."""
        if self.observe:
            entry = self._settling.pop((job_id, attempt), None)
            if entry is not None:
                self.observe.finished(entry[0], outcome.value, entry[1], error)

    def timed_out(
        self, run: JobRun, outcome: Outcome, timeout: float, error: BaseException
    ) -> None:
        """The heartbeat recorded the attempt's timeout: report it now, with the timeout."""
        key = (run.id, run.attempt)
        with self._lock:  # the handler may have returned meanwhile (see ran)
            if self._settling.pop(key, None) is None:
                self._timed_out.add(key)
        self.observe.finished(run, outcome.value, timeout, error)

    def completed(self, done: list[_Key]) -> None:
        """Batched completions recorded."""
        for job_id, attempt in done:
            self.report(job_id, attempt, Outcome.SUCCEEDED)

    def unrecorded(self, lost: list[_Key]) -> None:
        """Batched completions that could not be recorded."""
        for job_id, attempt in lost:
            self.report(job_id, attempt, Outcome.LOST)


class HeldResults:
    """What handlers of tasks that keep results returned (JSON text), per attempt, until the
    attempt's completion statement takes it; dropped when the attempt ends otherwise."""

    def __init__(self) -> None:
        self._held: dict[_Key, str] = {}

    def hold(self, job: Claimed, text: str) -> None:
        self._held[(job.id, job.attempts)] = text

    def take(self, job_id: int, attempt: int) -> str | None:
        """The attempt's result, if it has one; forgotten here."""
        return self._held.pop((job_id, attempt), None) if self._held else None

    def take_many(self, batch: Iterable[_Key]) -> str:
        """The batch's results as one JSON object from job id to result (``{}``: none)."""
        if not self._held:
            return "{}"
        found = ((job_id, self._held.pop((job_id, attempt), None)) for job_id, attempt in batch)
        return "{" + ",".join(f'"{job_id}":{text}' for job_id, text in found if text) + "}"


class Recorder:
    """Writes verdicts, each with its fenced statement, on the worker's own connections.

    Owns the :class:`Completer` that batches completions; :meth:`close` flushes it.
    ``handoff``, if given, claims the successors of batched completions that held slots of a
    limited queue, in the batch's own statement.
    """

    def __init__(
        self,
        single: Engine,
        reports: Reports,
        *,
        handoff: HandOff | None = None,
        on_flushed: Callable[[], None] | None = None,
        clock: StopClock | None = None,
    ) -> None:
        self._single = single
        self._clock = clock
        self.reports = reports
        self._batch_conn = HeldConnection(single)  # the completer thread's alone
        # Completes jobs holding slots and claims their successors at once.
        self._handoff = handoff
        #: The results waiting for their attempts' completions.
        self.results = HeldResults()
        # The queue of each slot-holding attempt whose completion waits for its batch.
        self._slots: dict[_Key, str] = {}
        self._slots_lock = threading.Lock()
        self._completer = Completer(
            self._complete_batch,
            self.not_completed,
            reports.completed,
            reports.unrecorded,
            on_flushed=on_flushed,
            retry_for=RECORD_RETRY,
            retryable=transient,
            clock=clock,
        )

    def completing(self) -> bool:
        """Whether completions wait for their batch (see ``Completer.pending``)."""
        return self._completer.pending()

    def close(self, timeout: float | None = None) -> int:
        """Flush the completions still waiting for their batch; how many were still not
        written after ``timeout`` seconds (left to their leases)."""
        unwritten = self._completer.close(timeout)
        if not unwritten:
            self._batch_conn.close()
        return unwritten

    def record(self, job: Claimed, verdict: Verdict, task: Task) -> None:
        """Write a verdict in a statement of its own (or the next batch, for a completion).

        ``Complete(batched=False)`` is written in the handler's transaction instead (see
        :meth:`complete_in`); once that matched no row, the attempt is written as Abandon.
        """
        if not isinstance(verdict, Complete):
            self.results.take(job.id, job.attempts)  # not completed: nothing to store
        if isinstance(verdict, Complete):
            # Nothing to commit with the completion: it goes out in a batch with others'.
            if job.holds_slot:
                # The slot of the queue's cap is free once this commits: the job's thread,
                # and so its lane's next claim, waits for that (the lease covers the wait).
                # The batch claims the slot's next job as it commits (see HandOff).
                with self._slots_lock:
                    self._slots[(job.id, job.attempts)] = job.queue
                self._completer.add_and_wait(job.id, job.attempts, job.lease.total_seconds())
            else:
                self._completer.add(job.id, job.attempts)
        elif isinstance(verdict, Abandon):
            self.not_completed(job.id, job.attempts)
        elif isinstance(verdict, Release):
            self._control_flow(job, verdict)
        elif isinstance(verdict, Fail):
            self._record_failure(job, verdict, policy(job, task))
        else:
            self._control_flow(job, verdict)

    # -- success ----------------------------------------------------------------------------

    def complete_in(self, session: HandlerSession, job: Claimed) -> bool:
        """The fenced completion in the handler's own transaction, committed with its writes.

        False if it matched no row (cancelled, or no longer this worker's): the caller rolls
        the session back and records Abandon.
        """
        conn = session.connection()
        params = {**_fence(job), "result": self.results.take(job.id, job.attempts)}
        with deadline(conn):
            done = conn.execute(transitions.complete(), params).rowcount == 1
            if done:
                session.commit_for_real()
        if done:
            self.reports.report(job.id, job.attempts, Outcome.SUCCEEDED)
            log.debug("job %d (%s) attempt %d succeeded", job.id, job.task, job.attempts)
        return done

    async def complete_in_async(self, session: AsyncSession, job: Claimed) -> bool:
        """:meth:`complete_in`, for an async handler's session."""
        params = {**_fence(job), "result": self.results.take(job.id, job.attempts)}
        result = await session.execute(transitions.complete(), params)
        if cast(CursorResult[Any], result).rowcount != 1:
            return False
        await session.run_sync(lambda sync: cast(HandlerSession, sync).commit_for_real())
        self.reports.report(job.id, job.attempts, Outcome.SUCCEEDED)
        return True

    def _complete_batch(self, batch: list[_Key]) -> set[int]:
        """Complete a batch of attempts that wrote nothing (on the completer's thread).

        When some of them hold slots of a limited queue, the statement also claims as many of
        that queue's jobs (the one with the most, if several), within its limits.
        """
        freed: Counter[str] = Counter()
        if self._slots:  # only jobs of limited queues are noted there
            with self._slots_lock:
                freed.update(q for q in map(self._slots.pop, batch, repeat(None)) if q is not None)
        results = self.results.take_many(batch)
        if freed and self._handoff is not None:
            queue, n = freed.most_common(1)[0]
            try:
                return self._handoff.complete(self._batch_conn, batch, results, queue, n)
            except SQLAlchemyError as exc:  # completed below, without the claim
                log.warning("completing and claiming in one failed: %s", one_line(exc))
        rows = self._batch_conn.rows(
            transitions.complete_many(),
            {**held_many(batch), "results": results},
            # A connection lost on the way (a silent network cut at its deadline) most likely
            # never delivered the statement: try once more on a fresh one rather than leave
            # the jobs to run again after their leases.
            again=True,
        )
        return {row.id for row in rows}

    def complete_group(self, conn: Connection, jobs: list[Claimed]) -> set[int]:
        """Complete a group's jobs on its shared connection; the ids that matched."""
        if not jobs:
            return set()
        pairs = [(j.id, j.attempts) for j in jobs]
        params = {**held_many(pairs), "results": self.results.take_many(pairs)}
        return set(conn.execute(transitions.complete_many(), params).scalars())

    # -- no completion ----------------------------------------------------------------------

    def not_completed(self, job_id: int, attempt: int) -> None:
        """A completion matched no row: the job was cancelled, or the attempt is stale (its
        lease was lost or it timed out). Either way its writes were rolled back."""
        fence = {"job_id": job_id, "attempt": attempt}

        def write() -> bool:
            with self._single.connect() as conn:
                return conn.execute(transitions.finish_cancelled(), fence).rowcount == 1

        try:
            cancelled = retrying(
                write, f"job {job_id}: could not settle attempt {attempt}", self._clock
            )
        except SQLAlchemyError as exc:  # the job stays as it is; its lease settles it
            log.warning("job %d: could not settle attempt %d: %s", job_id, attempt, one_line(exc))
            self.reports.report(job_id, attempt, Outcome.LOST, exc)
            return
        outcome = outcome_of(ABANDON, CANCELLED if cancelled else None)
        self.reports.report(job_id, attempt, outcome)
        if cancelled:
            log.info("job %d was cancelled", job_id)
        else:
            log.warning(
                "job %d: attempt %d lost its lease (or timed out) before completing",
                job_id,
                attempt,
            )

    def hand_back(
        self, jobs: list[Claimed], why: str, *, report: bool = False, ran: bool = False
    ) -> None:
        """Return attempts to the queue (fenced), due again at once: as if never claimed, or,
        if their handlers ``ran`` (a group rolled back), with their attempt numbers spent and
        one more attempt each (see ``transitions.release_ran``)."""
        params = held_many((job.id, job.attempts) for job in jobs)
        statement = transitions.release_ran() if ran else transitions.release()

        def write() -> list[Row[Any]]:
            with self._single.connect() as conn:
                return list(conn.execute(statement, params).all())

        try:
            released = retrying(write, f"could not hand back {len(jobs)} job(s)", self._clock)
        except SQLAlchemyError as exc:
            log.warning(
                "could not hand back %d job(s) (%s); they will be reclaimed when their leases"
                " expire",
                len(jobs),
                one_line(exc),
            )
        else:
            log.info("handed back %d claimed job(s): %s", len(released), why)
        if report:
            for job in jobs:
                self.reports.report(job.id, job.attempts, Outcome.HANDED_BACK)

    def unrecorded(self, jobs: list[Claimed], exc: BaseException | None) -> None:
        """Their outcomes were lost with their connection (the handler's transaction, their
        writes with it), or could not be written at all.

        Their leases are ended now, fenced, on a fresh connection: the next claim takes the
        jobs over (their attempt counted, as after a crash) at once, not when their leases
        run out, and meanwhile the worker holds no job it no longer runs. If even that
        cannot be written, the leases run out as they would have.
        """
        params = held_many((job.id, job.attempts) for job in jobs)

        def write() -> list[Row[Any]]:
            with self._single.connect() as conn:
                return list(conn.execute(leases_sql.end_leases(), params).all())

        why = "" if exc is None else f" ({one_line(exc)})"
        try:
            retrying(write, f"could not end the leases of {len(jobs)} job(s)", self._clock)
        except SQLAlchemyError:
            when = "after their leases expire"
        else:
            when = "at once"
        attempts = ", ".join(f"{job.id} (attempt {job.attempts})" for job in jobs[:10])
        more = f" and {len(jobs) - 10} more" if len(jobs) > 10 else ""
        log.error(
            "could not record the outcome of job %s%s%s; retried %s",
            attempts,
            more,
            why,
            when,
        )
        for job in jobs:
            self.reports.report(job.id, job.attempts, Outcome.LOST, exc)

    def unknown_task(self, job: Claimed, exc: Exception) -> None:
        """A job whose task this worker does not know: a failed attempt, retried after the
        backoff of ``unknown_task_policy`` (dead once its attempts run out)."""
        if self.reports.observe:  # observers hear of it as of any failed attempt
            self.reports.ran(job, job.run(), None)
        self._record_failure(job, Fail(exc), unknown_task_policy(job))

    def unrunnable(self, job: Claimed, exc: Exception) -> None:
        """A job no attempt could run (an undecodable payload): straight to dead, or
        cancelled if its cancellation was requested meanwhile."""
        params = {**_fence(job), "error": error_json(exc)}

        def write() -> Row[Any] | None:
            with self._single.connect() as conn:
                return conn.execute(transitions.bury(), params).one_or_none()

        row = retrying(write, f"job {job.id}: could not record it as dead", self._clock)
        status = None if row is None else row.status
        outcome = {None: Outcome.LOST, CANCELLED: Outcome.CANCELLED}.get(status, Outcome.DEAD)
        if outcome is Outcome.DEAD:
            log.error("job %d: %s; moved to dead", job.id, one_line(exc))
        elif outcome is Outcome.CANCELLED:
            log.info("job %d: %s; it was cancelled", job.id, one_line(exc))
        else:
            log.warning(
                "job %d: %s; attempt %d had lost its lease", job.id, one_line(exc), job.attempts
            )
        if self.reports.observe:
            self.reports.observe.finished(job.run(), outcome.value, None, exc)

    # -- failure ----------------------------------------------------------------------------

    def fail(
        self, job_id: int, attempt: int, backoff: Backoff, exc: BaseException
    ) -> Row[Any] | None:
        """Record one failed attempt (fenced); the job's new status, or None if it was stale."""
        with self._single.connect() as conn:
            return conn.execute(
                transitions.fail(),
                {
                    "job_id": job_id,
                    "attempt": attempt,
                    "delay": retry_delay(backoff, attempt).total_seconds(),
                    "error": error_json(exc),
                },
            ).one_or_none()

    def _record_failure(self, job: Claimed, verdict: Fail, backoff: Backoff) -> None:
        exc = verdict.error
        row = retrying(
            lambda: self.fail(job.id, job.attempts, backoff, exc),
            f"job {job.id}: could not record the failure of attempt {job.attempts}",
            self._clock,
        )
        self.reports.report(
            job.id, job.attempts, outcome_of(verdict, None if row is None else row.status), exc
        )
        if row is None:
            log.warning(
                "job %d: attempt %d failed after losing its lease (or timing out); ignored",
                job.id,
                job.attempts,
            )
        elif row.status == CANCELLED:
            log.info("job %d (%s) was cancelled", job.id, job.task)
        elif row.status == DEAD:
            log.error(
                "job %d (%s) failed on its last attempt (%d/%d), moved to dead: %s",
                job.id,
                job.task,
                job.attempts,
                job.max_attempts,
                one_line(exc),
            )
        else:
            log.info(
                "job %d (%s) attempt %d failed, retrying at %s: %s",
                job.id,
                job.task,
                job.attempts,
                row.visible_at.isoformat(),
                one_line(exc),
            )

    def _control_flow(self, job: Claimed, verdict: Snooze | Bury | Release) -> None:
        """A handler asked for its job to run again later (Retry) or never again (Discard),
        or stopped part-way at its worker's shutdown (Release: as a Retry due at once)."""
        exc: Exception
        if isinstance(verdict, Release):
            # Not handed back with its attempt taken back: the next claim would reuse the
            # number, and two attempts would share one fence (see release_stopped).
            exc = Retry(reason=SHUTDOWN_RELEASE)
            params = _fence(job)
            statement = transitions.release_stopped()
        elif isinstance(verdict, Snooze):
            exc = verdict.retry
            params = {**_fence(job), "delay": verdict.retry.after.total_seconds()}
            statement = transitions.snooze()
        else:
            exc = verdict.error
            params = {**_fence(job), "error": error_json(exc)}
            statement = transitions.bury()

        def write() -> Row[Any] | None:
            with self._single.connect() as conn:
                return conn.execute(statement, params).one_or_none()

        row = retrying(write, f"job {job.id}: could not record attempt {job.attempts}", self._clock)
        outcome = outcome_of(verdict, None if row is None else row.status)
        self.reports.report(job.id, job.attempts, outcome, exc)
        if row is None:
            log.warning("job %d: attempt %d ended after losing its lease", job.id, job.attempts)
        elif outcome is Outcome.CANCELLED:
            log.info("job %d (%s) was cancelled", job.id, job.task)
        elif isinstance(verdict, Release):
            log.info("job %d (%s) handed back: %s", job.id, job.task, SHUTDOWN_RELEASE)
        elif isinstance(verdict, Snooze):
            log.info("job %d (%s) will run again at %s", job.id, job.task, row.visible_at)
        else:
            log.info("job %d (%s) discarded: %s", job.id, job.task, verdict.reason)


def _fence(job: Claimed) -> dict[str, object]:
    return {"job_id": job.id, "attempt": job.attempts}
