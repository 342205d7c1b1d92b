"""The heartbeat: lease renewal, lost leases, cancellation requests and timeouts."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping

from sqlalchemy import Engine

from .._deadlines import DEADLINE_OPTION, STATEMENT_DEADLINE
from .._error_text import one_line
from .._sql import leases as leases_sql
from .._sql.fence import held_many
from ..observability import Observers
from ._leases import Held, LeaseTable, overdue, renewal_due, schedule_renewals, schedule_retries
from ._recorder import Recorder
from ._settlement import Fail, outcome_of

log = logging.getLogger("sa_jobqueue.worker")

#: How often the heartbeat thread looks for leases due for renewal (seconds). It only talks to
#: the database when one is due.
HEARTBEAT_TICK = 0.1


class Heartbeat:
    """Renews the leases of running jobs and enforces their timeouts, until ``halt`` is set.

    What it does not do: stop a sync handler. It sets the handler's stop flag (lost lease,
    cancellation, timeout) and the handler decides; the fence keeps a stale attempt's
    outcome from being recorded whatever it does.
    """

    def __init__(
        self,
        single: Engine,
        leases: LeaseTable,
        recorder: Recorder,
        observe: Observers,
        halt: threading.Event,
    ) -> None:
        self._single = single
        self._leases = leases
        self._recorder = recorder
        self._observe = observe
        self._halt = halt

    def loop(self) -> None:
        """Renew the leases of all running jobs in one statement when the first one is due.

        Each job is renewed a third of its lease after its last renewal, so two renewals in a
        row can fail (a slow statement, a brief network blip) before its lease runs out.
        """
        failing = False
        while not self._halt.wait(HEARTBEAT_TICK):
            held = self._leases.snapshot()
            now = time.monotonic()
            for job_id in overdue(held, now):
                self._time_out(job_id, held.pop(job_id))  # and its lease is renewed no more
            if not renewal_due(held, now):
                continue
            try:
                busy = self._renew(held)
            except Exception as exc:  # keep the heartbeat alive whatever happens
                if not failing:
                    log.warning("lease renewal failed (%s); retrying", one_line(exc))
                failing = True
                schedule_retries(held, now)
                continue
            if failing:
                log.info("lease renewal works again")
            failing = False
            schedule_renewals(held, now, busy)

    def _renew(self, held: Mapping[int, Held]) -> set[int]:
        """Renew these leases; tell the handlers of lost and cancelled jobs to stop.

        Returns the jobs that could not be renewed because another transaction held their
        rows locked for the moment; they are still this worker's, to be renewed again soon.
        """
        params = held_many((job_id, h.attempt) for job_id, h in held.items())
        # A renewal stuck on a silent connection is given up in time to retry on a fresh one
        # before the shortest lease runs out (a third of it, as renewals are spaced).
        shortest = min(h.lease.total_seconds() for h in held.values())
        deadline = max(1.0, min(STATEMENT_DEADLINE, shortest / 3))
        with self._single.connect() as conn:
            conn.execution_options(**{DEADLINE_OPTION: deadline})
            rows = conn.execute(leases_sql.extend_leases(), params)
            kept = {row.id: row.cancel_requested for row in rows}
            busy: set[int] = set()
            if len(kept) < len(held):
                busy = set(conn.execute(leases_sql.still_held(), params).scalars()) - set(kept)
        still = self._leases.ours(held)  # jobs that finished meanwhile were simply not renewed
        for job_id in still - set(kept) - busy:
            ctx = held[job_id].ctx
            if ctx is not None and not ctx.stop_requested:
                log.warning("job %d lost its lease; asking its handler to stop", job_id)
                ctx._stop = True
                run = held[job_id].run
                if run is not None:
                    self._observe.lease_lost(run)
        for job_id, cancel in kept.items():
            ctx = held[job_id].ctx
            if cancel and ctx is not None and not ctx.cancel_requested:
                log.info("job %d: cancellation requested; asking its handler to stop", job_id)
                ctx._cancel = True
                ctx._stop = True
        return busy

    def _time_out(self, job_id: int, held: Held) -> None:
        """Record an attempt that ran past its task's timeout as failed, and stop renewing it."""
        self._leases.drop(job_id, held)
        assert held.task is not None
        assert held.task.timeout is not None
        error = TimeoutError(f"the attempt ran longer than its timeout of {held.task.timeout}")
        # Record the failure before telling the handler: a handler that stops at once would
        # otherwise race to its completion, which would still match the fence and commit.
        try:
            row = self._recorder.fail(
                job_id, held.attempt, held.backoff or held.task.backoff, error
            )
        except Exception as exc:  # the lease then simply runs out and the claim takes over
            log.warning("job %d: could not record its timeout: %s", job_id, one_line(exc))
            return
        finally:
            if held.ctx is not None:
                held.ctx._stop = True
        if row is not None:
            log.warning("job %d timed out on attempt %d; now %s", job_id, held.attempt, row.status)
            if held.run is not None:
                outcome = outcome_of(Fail(error), row.status)
                timeout = held.task.timeout.total_seconds()
                self._recorder.reports.timed_out(held.run, outcome, timeout, error)
