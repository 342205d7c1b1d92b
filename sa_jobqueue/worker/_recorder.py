"""The one door an attempt's outcome leaves by: every transition is written, and every
outcome told to the observers, through :class:`Recorder`.

Each :data:`~sa_jobqueue.worker._settlement.Verdict` has its statement here, and every
statement is fenced on ``(job id, attempt)``: a stale attempt's write matches no row and
changes nothing. Successes are written by :class:`~sa_jobqueue.worker._successes.Successes`
(with the handler's writes, with its group's or batch's commit, or in a batch of completions),
which the recorder owns; everything else here, each outcome in a statement of its own, tried
again through transient errors (see :mod:`~sa_jobqueue.worker._retries`). The paths that run
attempts (job threads and their groups, the event loop, batch tasks, hard-limited children)
and the heartbeat (timeouts) come here to end one; none writes a transition or tells an
observer an outcome itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, Row
from sqlalchemy.exc import SQLAlchemyError

from .._backoff import UNKNOWN_TASK_BACKOFF, Backoff, policy_of, retry_delay
from .._deadlines import StopClock
from .._error_text import error_json, one_line
from .._sql import leases as leases_sql
from .._sql import transitions
from .._sql.fence import held_many
from ..models import CANCELLED, DEAD
from ..tasks import Retry, Task
from ._claimed import Claimed
from ._reports import Reports
from ._retries import retrying
from ._sessions import HandlerSession
from ._settlement import (
    ABANDON,
    BATCHED,
    Abandon,
    Bury,
    Complete,
    Fail,
    Outcome,
    Release,
    Snooze,
    Verdict,
    outcome_of,
    settle,
)
from ._successes import HeldResults, Successes

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from ..observability import JobRun
    from ._isolation import ChildEnd
    from ._successes import HandOff

log = logging.getLogger("sa_jobqueue.worker")

#: Why a job stopped part-way by its worker's shutdown went back to the queue.
SHUTDOWN_RELEASE = "stopped part-way by the worker's shutdown"


class Recorder:
    """Writes verdicts, each with its fenced statement, on the worker's own connections.

    Owns the :class:`Successes`, built with it: ``handoff`` (claims the successors of
    batched completions that held slots of a limited queue), ``on_flushed`` (told after each
    batch) and ``clock`` (hurries retries once the worker stops) go there too. :meth:`close`
    flushes the batched completions.
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
        self._successes = Successes(
            single,
            reports,
            self.not_completed,
            handoff=handoff,
            on_flushed=on_flushed,
            clock=clock,
        )

    @property
    def results(self) -> HeldResults:
        """The results waiting for their attempts' completions."""
        return self._successes.results

    def completing(self) -> bool:
        """Whether completions wait for their batch (see ``Completer.pending``)."""
        return self._successes.pending()

    def close(self, timeout: float | None = None) -> int:
        """Flush the completions still waiting for their batch; how many were still not
        written after ``timeout`` seconds (left to their leases)."""
        return self._successes.close(timeout)

    def record(self, job: Claimed, verdict: Verdict, task: Task) -> None:
        """Write a verdict in a statement of its own (or the next batch, for a completion).

        ``Complete(batched=False)`` is written in the handler's transaction instead (see
        :meth:`complete_in`); once that matched no row, the attempt is written as Abandon.
        """
        if not isinstance(verdict, Complete):
            self.results.take(job.id, job.attempts)  # not completed: nothing to store
        if isinstance(verdict, Complete):
            # Nothing to commit with the completion: it goes out in a batch with others'.
            self._successes.batch(job)
        elif isinstance(verdict, Abandon):
            self.not_completed(job.id, job.attempts)
        elif isinstance(verdict, Release):
            self._control_flow(job, verdict)
        elif isinstance(verdict, Fail):
            self._record_failure(job, verdict, policy_of(job.id, job.backoff, task.backoff))
        else:
            self._control_flow(job, verdict)

    def try_batch(self, job: Claimed) -> bool:
        """Queue an attempt's completion for the next batch if that needs no waiting (see
        :meth:`Successes.try_batch`); False if it would wait: :meth:`record` it then, on a
        thread that may block.

        For the event loop, where a wait would stall every other handler: recording a
        success this way touches no connection and takes no lock held across I/O.
        """
        return self._successes.try_batch(job)

    # -- success: see Successes -----------------------------------------------------------

    def complete_in(self, session: HandlerSession, job: Claimed) -> bool:
        """The fenced completion in the handler's own transaction (see
        :meth:`Successes.complete_in`); False if it matched no row."""
        return self._successes.complete_in(session, job)

    async def complete_in_async(self, session: AsyncSession, job: Claimed) -> bool:
        """:meth:`complete_in`, for an async handler's session."""
        return await self._successes.complete_in_async(session, job)

    def complete_group(self, conn: Connection, jobs: list[Claimed]) -> set[int]:
        """Complete a group's jobs on its shared connection; the ids that matched."""
        return self._successes.complete_group(conn, jobs)

    async def complete_group_async(self, session: AsyncSession, jobs: list[Claimed]) -> set[int]:
        """:meth:`complete_group` in an async handler's session; the ids that matched."""
        return await self._successes.complete_group_async(session, jobs)

    def completed_together(
        self, jobs: list[Claimed], done: set[int], why: str, others: list[Claimed] | None = None
    ) -> None:
        """Settle ``jobs`` after one statement completed them together (a group's commit, a
        batch's), in a transaction committed if it matched them all (``done``: the ids it
        matched) and rolled back otherwise.

        All matched: each succeeded. Otherwise their writes are gone: the jobs it no longer
        matched were cancelled or are stale (:meth:`not_completed`), and the others, with
        ``others`` (jobs of the same transaction that were not in the statement), go back to
        the queue with their attempts spent, ``why`` (see :meth:`hand_back` with ``ran``).
        """
        if len(done) == len(jobs):
            for job in jobs:
                self.reports.report(job.id, job.attempts, Outcome.SUCCEEDED)
            return
        again = [job for job in jobs if job.id in done] + (others or [])
        for job in jobs:
            if job.id not in done:
                self.not_completed(job.id, job.attempts)
        if again:
            self.hand_back(again, why, report=True, ran=True)

    def child_ended(self, job: Claimed, task: Task, end: ChildEnd) -> None:
        """Record how a hard-limited attempt's child ended (see ``_isolation``), unless the
        child committed its completion itself: then only tell the observers."""
        if end.failure is not None:
            # A kill at the limit during a shutdown is still the attempt's failure.
            verdict = settle(end.failure, wrote=False, shutting_down=end.stopped)
            self.record(job, verdict, task)
        elif end.completed is None:  # it wrote nothing: completed here, in a batch
            self.results.keep_encoded(job, end.result)
            self.record(job, BATCHED, task)
        elif end.completed:
            self.reports.report(job.id, job.attempts, Outcome.SUCCEEDED)
        else:  # its completion matched no row (cancelled, or no longer ours)
            self.record(job, ABANDON, task)

    def lost(self, jobs: list[Claimed]) -> None:
        """Nothing is known of these attempts' outcomes, and nothing is written: their leases
        settle them (the next claim takes them over). The observers hear they were lost."""
        for job in jobs:
            self.reports.report(job.id, job.attempts, Outcome.LOST)

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
        """Return attempts to the queue (fenced): as if never claimed, each in its place in
        the claim order again (see ``transitions.release``), or, if their handlers ``ran`` (a
        group rolled back), due at once with their attempt numbers spent and one more attempt
        each (see ``transitions.release_ran``)."""
        if ran:
            statement = transitions.release_ran()
            params = held_many((job.id, job.attempts) for job in jobs)
        else:
            statement = transitions.release()
            params = transitions.release_params((j.id, j.attempts, j.visible_at) for j in jobs)

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
        backoff of its own policy, or of ``UNKNOWN_TASK_BACKOFF`` (dead once its attempts run
        out)."""
        if self.reports.observe:  # observers hear of it as of any failed attempt
            self.reports.ran(job, job.run(), None)
        self._record_failure(job, Fail(exc), policy_of(job.id, job.backoff, UNKNOWN_TASK_BACKOFF))

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

    def timed_out(self, row: Row[Any], run: JobRun, timeout: float, error: BaseException) -> None:
        """Tell the observers of an attempt whose timeout :meth:`fail` recorded (``row``, the
        job as it left it), with the timeout as its run time (see ``Reports.timed_out``)."""
        self.reports.timed_out(run, outcome_of(Fail(error), row.status), timeout, error)

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
