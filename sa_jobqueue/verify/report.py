"""What a ``sa-jobqueue verify`` run records, and what it concludes from the records.

The handler of the run (in :mod:`sa_jobqueue.verify.tasks`) writes two tables in the run's
schema: ``verify_runs`` for every execution, through an autocommit connection of its own, and
``verify_results`` through ``ctx.session``, which commits with the job's fenced completion.
:func:`measure` compares them with the jobs table and returns a :class:`Report`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import Connection

from .._sql import verify as verify_sql
from ..database import Pooler
from ..models import SUCCEEDED


@dataclass
class RunEvents:
    """What happened during a run besides the jobs: the kill, its replacement, the timeout."""

    killed_worker: int | None = None
    killed_worker_claimed_jobs: int = 0  # running or in its buffer, just before the kill
    killed_after_succeeded: int = 0
    killed_at: datetime | None = None  # by the database's clock
    replacement_worker: int | None = None
    timed_out: bool = False


@dataclass(frozen=True)
class Settings:
    """What one run does: ``jobs`` across ``workers`` processes of ``concurrency`` threads."""

    jobs: int = 10_000
    workers: int = 3
    concurrency: int = 4
    work: timedelta = timedelta(milliseconds=2)
    lease: timedelta = timedelta(seconds=3)
    timeout: timedelta = timedelta(minutes=5)
    listen: bool = True
    keep: bool = False
    #: What stands between verify and PostgreSQL (see sa_jobqueue.database.Pooler).
    pooler: Pooler = "session"


@dataclass
class Report:
    """What a run found. ``ok`` is the verdict: no job lost, no effect twice or unmatched."""

    schema: str
    schema_dropped: bool
    jobs: int
    workers: int
    concurrency: int
    lease_seconds: float
    work_ms: float
    killed_worker: int | None
    killed_worker_claimed_jobs: int
    killed_after_succeeded: int
    replacement_worker: int | None
    timed_out: bool
    statuses: dict[str, int]
    succeeded: int
    lost: int
    duplicates: int
    successes_without_result: int
    results_without_success: int
    executions: int
    jobs_run_more_than_once: int
    of_which_ran_on_killed_worker: int
    reclaimed_jobs: int
    drain_seconds: float
    throughput_jobs_per_second: float
    throughput_before_kill_jobs_per_second: float
    latency_ms: dict[str, float]
    wall_seconds: float
    unexpected_exits: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            self.lost == 0
            and self.duplicates == 0
            and self.successes_without_result == 0
            and self.results_without_success == 0
        )

    def as_json(self) -> str:
        return json.dumps({"ok": self.ok, **asdict(self)}, indent=2)

    def as_text(self) -> str:
        lat = self.latency_ms
        plural = "s" if self.workers != 1 else ""
        lines = [
            f"sa-jobqueue verify: {self.jobs:,} jobs, {self.workers} worker{plural} x"
            f" {self.concurrency} threads, lease {self.lease_seconds:g}s,"
            f" {self.work_ms:g} ms of work per job",
        ]
        if self.killed_worker is not None:
            lines.append(
                f"killed worker {self.killed_worker} (SIGKILL) with"
                f" {self.killed_worker_claimed_jobs} job(s) claimed, after"
                f" {self.killed_after_succeeded:,} had succeeded;"
                f" worker {self.replacement_worker} took its place"
            )
        lines += [f"warning: {line}" for line in self.unexpected_exits]
        if self.timed_out:
            lines.append("warning: not every job finished within --timeout")
        verdict = (
            "PASS: no job lost, every ctx.session write committed exactly once"
            if self.ok
            else "FAIL: jobs were lost, or ctx.session writes did not commit exactly once"
        )
        rows = [
            ("succeeded", f"{self.succeeded:,} of {self.jobs:,}"),
            ("lost", f"{self.lost:,}" + _statuses_note(self.statuses)),
            ("duplicate writes", f"{self.duplicates:,}"),
        ]
        if self.successes_without_result or self.results_without_success:
            rows += [
                ("successes without write", f"{self.successes_without_result:,}"),
                ("writes without success", f"{self.results_without_success:,}"),
            ]
        rows += [
            (
                "handler runs",
                f"{self.executions:,}: {self.jobs_run_more_than_once:,} job(s) ran more than"
                f" once, {self.of_which_ran_on_killed_worker:,} of them had run on the killed"
                " worker",
            ),
            ("reclaimed after a lease", f"{self.reclaimed_jobs:,} job(s)"),
            (
                "throughput",
                f"{self.throughput_before_kill_jobs_per_second:,.0f} jobs/s until the kill,"
                f" {self.throughput_jobs_per_second:,.0f} overall ({self.drain_seconds:.1f}s from"
                " first enqueue to last completion)",
            ),
            (
                "enqueue-to-start latency",
                f"p50 {lat['p50']:,.0f} ms, p95 {lat['p95']:,.0f} ms, p99 {lat['p99']:,.0f} ms,"
                f" max {lat['max']:,.0f} ms",
            ),
            ("wall time", f"{self.wall_seconds:.1f}s"),
        ]
        width = max(len(name) for name, _ in rows)
        lines += ["", verdict, ""]
        lines += [f"  {name:<{width}}  {value}" for name, value in rows]
        lines.append("")
        lines.append(
            f"schema {self.schema} dropped"
            if self.schema_dropped
            else f"schema {self.schema} kept (DROP SCHEMA {self.schema} CASCADE removes it)"
        )
        return "\n".join(lines)


def _statuses_note(statuses: dict[str, int]) -> str:
    others = {s: n for s, n in statuses.items() if s != SUCCEEDED and n}
    return f" ({', '.join(f'{n:,} {s}' for s, n in sorted(others.items()))})" if others else ""


def measure(
    conn: Connection, settings: Settings, schema: str, events: RunEvents | None = None
) -> Report:
    """Count what the run left in its schema (``conn`` must be on that schema)."""
    statuses: dict[str, int] = {s: n for s, n in conn.execute(verify_sql.jobs_per_status())}
    succeeded = statuses.get(SUCCEEDED, 0)
    rows, distinct = conn.execute(verify_sql.result_rows()).one()
    without_result = conn.execute(verify_sql.successes_without_result()).scalar_one()
    without_success = conn.execute(verify_sql.results_without_success()).scalar_one()

    events = events or RunEvents()
    killed = events.killed_worker
    executions, rerun, rerun_killed = conn.execute(
        verify_sql.executions(), {"killed_pid": killed if killed is not None else -1}
    ).one()
    reclaimed = conn.execute(verify_sql.reclaimed()).scalar_one()

    p50, p95, p99, worst = conn.execute(verify_sql.start_latency_ms()).one()
    drain = conn.execute(verify_sql.drain_seconds()).scalar()
    drain_seconds = float(drain or 0)
    before_kill = 0.0
    if events.killed_at is not None:
        done, elapsed = conn.execute(
            verify_sql.finished_before(), {"killed_at": events.killed_at}
        ).one()
        before_kill = done / float(elapsed) if elapsed else 0.0

    return Report(
        schema=schema,
        schema_dropped=False,
        jobs=settings.jobs,
        workers=settings.workers,
        concurrency=settings.concurrency,
        lease_seconds=settings.lease.total_seconds(),
        work_ms=settings.work.total_seconds() * 1000,
        killed_worker=killed,
        killed_worker_claimed_jobs=events.killed_worker_claimed_jobs,
        killed_after_succeeded=events.killed_after_succeeded,
        replacement_worker=events.replacement_worker,
        timed_out=events.timed_out,
        statuses=statuses,
        succeeded=succeeded,
        lost=settings.jobs - succeeded,
        duplicates=rows - distinct,
        successes_without_result=without_result,
        results_without_success=without_success,
        executions=int(executions),
        jobs_run_more_than_once=rerun,
        of_which_ran_on_killed_worker=rerun_killed,
        reclaimed_jobs=reclaimed,
        drain_seconds=round(drain_seconds, 3),
        throughput_jobs_per_second=round(succeeded / drain_seconds, 1) if drain_seconds else 0.0,
        throughput_before_kill_jobs_per_second=round(before_kill, 1),
        latency_ms={
            k: round(float(v or 0), 1)
            for k, v in zip(("p50", "p95", "p99", "max"), (p50, p95, p99, worst), strict=True)
        },
        wall_seconds=0.0,
    )
