"""Progress reports on their way to the jobs' rows: what a lease renewal carries, and after.

A handler's ``ctx.report_progress`` only replaces the report kept on its context
(``sa_jobqueue/_progress.py``). The heartbeat's renewal writes, for each attempt it renews,
the latest report not written yet, in the renewal's own statement (``_sql/leases.py``): no
statement per report, and none for attempts that report nothing. These functions are the
heartbeat's side of it, pure and lock-free: the handler's thread only ever replaces
``ctx._progress``, the heartbeat's only ever sets ``ctx._progress_written``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from .._progress import ProgressReport
from ..tasks import JobContext
from ._leases import Held

#: The soonest a report brings a worker's next renewal forward, in seconds after its last one.
#: Leases are renewed every third of their length (10 s for the default 30 s lease); a report
#: made since the last renewal is written PROGRESS_INTERVAL after it at the latest when that
#: is sooner. So a worker sends at most one renewal more every 2 s, however many of its jobs
#: report and however often (a report in a tight loop costs the assignment of one reference),
#: and that renewal takes only the attempts with a report to write.
PROGRESS_INTERVAL: Final = 2.0


def unwritten(ctx: JobContext | None) -> ProgressReport | None:
    """The context's latest report, if the heartbeat has not written (or given up) that one."""
    if ctx is None:
        return None
    report = ctx._progress  # read once: the handler's thread may replace it at any moment
    return None if report is None or report is ctx._progress_written else report


def reporting(held: Mapping[int, Held]) -> dict[int, Held]:
    """The attempts of ``held`` with a report to write."""
    return {i: h for i, h in held.items() if unwritten(h.ctx) is not None}


class Carried:
    """The reports one renewal carries: its ``:progress`` parameter, and what to mark after."""

    __slots__ = ("_by_job", "param")

    def __init__(self, held: Mapping[int, Held]) -> None:
        #: ``{"<job id>": {"fraction": f, "message": m}}`` (see ``leases.extend_leases``).
        self.param: dict[str, Any] = {}
        self._by_job: dict[int, tuple[JobContext, ProgressReport]] = {}
        for job_id, h in held.items():
            report = unwritten(h.ctx)
            if report is not None:
                assert h.ctx is not None
                self.param[str(job_id)] = {"fraction": report.fraction, "message": report.message}
                self._by_job[job_id] = (h.ctx, report)

    def __len__(self) -> int:
        return len(self._by_job)

    def written(self, renewed: set[int] | Mapping[int, object]) -> None:
        """The renewal committed, renewing ``renewed``: their reports are written.

        A context shared by several jobs (a batch's) counts as written only once every one of
        its jobs was renewed: one whose row was locked gets the report at its retry.
        """
        missed = {id(ctx) for job_id, (ctx, _) in self._by_job.items() if job_id not in renewed}
        for ctx, report in self._by_job.values():
            if id(ctx) not in missed:
                ctx._progress_written = report

    def given_up(self) -> None:
        """The renewal failed: give its reports up, so that the retry renews the leases alone
        and a report the database refuses can never keep a lease from being renewed. The
        handler's next report is written as usual."""
        for ctx, report in self._by_job.values():
            ctx._progress_written = report
