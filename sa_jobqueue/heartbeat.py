"""The heartbeat: lease renewal, lost leases, cancellation requests and timeouts."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping

from ._deadlines import DEADLINE_OPTION, STATEMENT_DEADLINE
from ._error_text import one_line
from ._sql import leases
from .attempts import FAILED_AS, Held
from .running import JobRunner

log = logging.getLogger("sa_jobqueue.worker")

#: How often the heartbeat thread looks for leases due for renewal (seconds). It only talks to
#: the database when one is due.
HEARTBEAT_TICK = 0.1
#: How soon a lease whose row was locked by another transaction is renewed again (seconds).
HEARTBEAT_RETRY = 0.5


class Heartbeat(JobRunner):
    """The thread that renews the leases of running jobs and enforces their timeouts."""

    _halt: threading.Event  # set by Worker: run() is over, stop renewing leases

    def _heartbeat_loop(self) -> None:
        """Renew the leases of all running jobs in one statement when the first one is due.

        Each job is renewed a third of its lease after its last renewal, so two renewals in a
        row can fail (a slow statement, a brief network blip) before its lease runs out.
        """
        failing = False
        while not self._halt.wait(HEARTBEAT_TICK):
            with self._lock:
                held = dict(self._active)
            now = time.monotonic()
            overdue = [i for i, h in held.items() if h.deadline is not None and h.deadline <= now]
            for job_id in overdue:
                self._time_out(job_id, held.pop(job_id))  # and its lease is renewed no more
            if not any(h.renew_at <= now for h in held.values()):
                continue
            try:
                busy = self._renew(held)
            except Exception as exc:  # keep the heartbeat alive whatever happens
                if not failing:
                    log.warning("lease renewal failed (%s); retrying", one_line(exc))
                failing = True
                # Try again soon, but not on every tick: a tenth of the lease, at least 0.5 s.
                for h in held.values():
                    h.renew_at = now + max(h.lease.total_seconds() / 10, 0.5)
                continue
            if failing:
                log.info("lease renewal works again")
            failing = False
            for job_id, h in held.items():
                # A row locked by someone else for now: try again in a moment.
                wait = HEARTBEAT_RETRY if job_id in busy else h.lease.total_seconds() / 3
                h.renew_at = now + wait

    def _renew(self, held: Mapping[int, Held]) -> set[int]:
        """Renew these leases; tell the handlers of lost and cancelled jobs to stop.

        Returns the jobs that could not be renewed because another transaction held their
        rows locked for the moment; they are still this worker's, to be renewed again soon.
        """
        ids = list(held)
        params = {"job_ids": ids, "attempt_list": [held[i].attempt for i in ids]}
        # A renewal stuck on a silent connection is given up in time to retry on a fresh one
        # before the shortest lease runs out (a third of it, as renewals are spaced).
        shortest = min(h.lease.total_seconds() for h in held.values())
        deadline = max(1.0, min(STATEMENT_DEADLINE, shortest / 3))
        with self._single.connect() as conn:
            conn.execution_options(**{DEADLINE_OPTION: deadline})
            rows = conn.execute(leases.extend_leases(), params)
            kept = {row.id: row.cancel_requested for row in rows}
            busy: set[int] = set()
            if len(kept) < len(ids):
                busy = set(conn.execute(leases.still_held(), params).scalars()) - set(kept)
        with self._lock:  # jobs that finished meanwhile were simply not renewed
            still = {i for i in ids if self._active.get(i) is held[i]}
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
        with self._lock:
            if self._active.get(job_id) is held:
                del self._active[job_id]
        assert held.task is not None
        assert held.task.timeout is not None
        error = TimeoutError(f"the attempt ran longer than its timeout of {held.task.timeout}")
        # Record the failure before telling the handler: a handler that stops at once would
        # otherwise race to its completion, which would still match the fence and commit.
        try:
            row = self._fail(job_id, held.attempt, held.backoff or held.task.backoff, error)
        except Exception as exc:  # the lease then simply runs out and the claim takes over
            log.warning("job %d: could not record its timeout: %s", job_id, one_line(exc))
            return
        finally:
            if held.ctx is not None:
                held.ctx._stop = True
        if row is not None:
            log.warning("job %d timed out on attempt %d; now %s", job_id, held.attempt, row.status)
            if held.run is not None:
                key = (job_id, held.attempt)
                with self._lock:  # the handler may have returned meanwhile (see _ran)
                    if self._settling.pop(key, None) is None:
                        self._timed_out.add(key)
                timeout = held.task.timeout.total_seconds()
                outcome = FAILED_AS.get(row.status, "retried")
                self._observe.finished(held.run, outcome, timeout, error)
