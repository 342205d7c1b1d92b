"""The heartbeat: lease renewal (with the progress handlers reported), lost leases,
cancellation requests and timeouts."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, Engine

from .._deadlines import DEADLINE_OPTION, DEADLINES, STATEMENT_DEADLINE
from .._error_text import one_line
from .._sql import leases as leases_sql
from .._sql.fence import held_many
from ..database import pooler_of
from ..observability import Observers
from ._leases import Held, LeaseTable, overdue, renewal_due, schedule_renewals, schedule_retries
from ._progress import PROGRESS_INTERVAL, Carried, reporting
from ._recorder import Recorder
from ._sessions import waiting_on

log = logging.getLogger("sa_jobqueue.worker")

#: How often the heartbeat thread looks for leases due for renewal (seconds). It only talks to
#: the database when one is due.
HEARTBEAT_TICK = 0.1
#: A handler seen waiting for an answer on a connection whose server process is running
#: nothing, at renewals at least this far apart (seconds), waits on a silent connection: the
#: answer was sent and lost on the way, and will never come. Its connection is then cut. Far
#: above the moments a statement spends in flight either way, so a live one is never cut.
SILENT_AFTER = 5.0


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
        self.last_turn: float | None = None  # time.monotonic(), for the liveness probe (_pulse)
        self._leases = leases
        self._recorder = recorder
        self._observe = observe
        self._halt = halt
        self._probe: bool | None = None  # whether to look for silent handlers (see _renew)
        self._silent: dict[int, float] = {}  # deadline token -> when first seen waiting so
        self._failing = False  # the last renewal failed (said once, and once when it works)
        self._progress_after = 0.0  # time.monotonic() before which no report brings one forward

    def loop(self) -> None:
        """Renew the leases of all running jobs in one statement when the first one is due.

        Each job is renewed a third of its lease after its last renewal, so two renewals in a
        row can fail (a slow statement, a brief network blip) before its lease runs out.
        """
        while not self._halt.wait(HEARTBEAT_TICK):
            self.last_turn = now = time.monotonic()
            self.turn(now)

    def turn(self, now: float) -> None:
        """One look at the held attempts: time out the overdue, renew leases if one is due.

        When none is due, attempts whose handler reported progress are renewed (and their
        progress written) anyway once PROGRESS_INTERVAL has passed since the last renewal: only
        they, so that a report costs the others nothing.
        """
        held = self._leases.snapshot()
        for job_id in overdue(held, now):
            self._time_out(job_id, held.pop(job_id))  # and its lease is renewed no more
        full = renewal_due(held, now)
        if not full:
            if now < self._progress_after:
                return
            held = reporting(held)
            if not held:
                return
        self._progress_after = now + PROGRESS_INTERVAL
        try:
            busy = self._renew(held, full=full)
        except Exception as exc:  # keep the heartbeat alive whatever happens
            if not self._failing:
                log.warning("lease renewal failed (%s); retrying", one_line(exc))
            self._failing = True
            schedule_retries(held, now)
            return
        if self._failing:
            log.info("lease renewal works again")
        self._failing = False
        schedule_renewals(held, now, busy)

    def _renew(self, held: Mapping[int, Held], *, full: bool = True) -> set[int]:
        """Renew these leases, writing the progress reported since; tell the handlers of lost
        and cancelled jobs to stop. ``full``: all the held attempts (not only those with a
        report to write), the turn at which silent connections are looked for.

        Returns the jobs that could not be renewed because another transaction held their
        rows locked for the moment; they are still this worker's, to be renewed again soon.
        """
        params: dict[str, Any] = held_many((job_id, h.attempt) for job_id, h in held.items())
        carried = Carried(held)
        params["progress"] = carried.param
        # A renewal stuck on a silent connection is given up in time to retry on a fresh one
        # before the shortest lease runs out (a third of it, as renewals are spaced).
        shortest = min(h.lease.total_seconds() for h in held.values())
        deadline = max(1.0, min(STATEMENT_DEADLINE, shortest / 3))
        try:
            with self._single.connect() as conn:
                conn.execution_options(**{DEADLINE_OPTION: deadline})
                rows = conn.execute(leases_sql.extend_leases(), params)
                kept = {row.id: row.cancel_requested for row in rows}
                carried.written(kept)  # committed: the connection is in autocommit
                busy: set[int] = set()
                if len(kept) < len(held):
                    found = conn.execute(leases_sql.still_held(), params).scalars()
                    busy = set(found) - set(kept)
                if self._probe is None:
                    # Behind a transaction pooler a connection's server process changes with
                    # each transaction, so the server cannot say what a handler's connection
                    # is doing.
                    self._probe = pooler_of(self._single) == "session"
                if self._probe and full:
                    self._cut_silent(conn, held)
        except Exception:
            if len(carried):
                log.warning(
                    "the progress of %d job(s) was not written with the failed renewal;"
                    " it is given up, their next report will be written",
                    len(carried),
                )
                carried.given_up()
            raise
        still = self._leases.ours(held)  # jobs that finished meanwhile were simply not renewed
        for job_id in still - set(kept) - busy:
            held[job_id].lost = True  # not to be started, if it still waits for a thread
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

    def _cut_silent(self, conn: Connection, held: Mapping[int, Held]) -> None:
        """Cut the connections of handlers that wait for an answer that will never come.

        A handler waiting for a statement's answer while the server process of its connection
        runs nothing (its answer was sent, or its statement never arrived) is on a connection
        that went silent; seen so at renewals SILENT_AFTER seconds apart, its connection is
        cut: the handler's statement raises, its attempt fails as usual, and its lease is no
        longer renewed for a wait that would last for ever. Whatever the task's timeout.
        """
        waiting: dict[int, tuple[int, int]] = {}  # token -> (job id, server process id)
        for job_id, h in held.items():
            found = None if h.ctx is None else waiting_on(h.ctx._sessions.made)
            if found is not None:
                waiting[found[1]] = (job_id, found[0])
        if not waiting:
            self._silent.clear()
            return
        pids = sorted({pid for _, pid in waiting.values()})
        working = set(conn.execute(leases_sql.working_backends(), {"pids": pids}).scalars())
        now = time.monotonic()
        silent: dict[int, float] = {}
        for token, (job_id, pid) in waiting.items():
            if pid in working:
                continue
            since = self._silent.get(token, now)
            if now - since < SILENT_AFTER:
                silent[token] = since
            elif DEADLINES.cut(token):
                log.warning(
                    "job %d: its handler has waited %.0f s for an answer its server is not"
                    " working on (a silent connection); cut that connection",
                    job_id,
                    now - since,
                )
        self._silent = silent

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
                timeout = held.task.timeout.total_seconds()
                self._recorder.timed_out(row, held.run, timeout, error)
