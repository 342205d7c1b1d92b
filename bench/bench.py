"""sa_jobqueue next to procrastinate, PgQueuer and Chancy, on one PostgreSQL, in one run.

    bench/run [--quick] [--repeat N] [--scenarios enqueue,bulk,...] [--systems ...] [--publish]

Uses $DATABASE_URL's server (each system gets fresh databases of its own there, created and
dropped by the run), or else an embedded PostgreSQL from the ``pgserver`` wheel. Prints the
command, the machine, the server's settings, the versions, each system's configuration and
one table per scenario; writes the raw result (everything the tables are computed from, and
every repetition) to bench/results/<timestamp>.json, and with ``--publish`` (a full run only)
to bench/runs/<date>-<host>.json as well, the committed home of the figures the docs quote.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# Run as `python bench/bench.py`: import the package `bench` from the repository root, not
# this file as a module named `bench`.
ROOT = Path(__file__).resolve().parent.parent
if sys.path and Path(sys.path[0]).resolve() == ROOT / "bench":
    sys.path[0] = str(ROOT)

import psycopg  # noqa: E402

from bench import harness, report  # noqa: E402
from bench.adapters.base import System  # noqa: E402
from bench.systems import SYSTEMS  # noqa: E402

RESULTS_DIR = ROOT / "bench" / "results"
#: Where ``--publish`` writes: committed, the source of every figure the docs quote.
RUNS_DIR = ROOT / "bench" / "runs"
#: Every peer configuration: the defaults and the tuned one of each.
PEERS = (
    "procrastinate", "procrastinate_c10", "pgqueuer", "pgqueuer_b100", "pgqueuer_b500", "chancy",
    "chancy_tuned",
)  # fmt: skip
#: The best configuration of each peer, for the long scenarios, with the defaults where a
#: drain of them fits the time cap.
BEST = ("procrastinate_c10", "pgqueuer_b100", "pgqueuer_b500", "chancy_tuned")

#: sa_jobqueue with every job tagged, without and with a GIN index on the tags (opt-in).
TAGGED = ("sa_jobqueue_tagged", "sa_jobqueue_tag_gin")
#: Which systems take part in which scenario (an enqueue is the same for a system's tunings).
ENQUEUERS = ("sa_jobqueue", "procrastinate", "pgqueuer", "chancy", "reference")
SCENARIO_SYSTEMS: dict[str, tuple[str, ...]] = {
    "enqueue": ENQUEUERS,
    "bulk": ENQUEUERS,
    "drain": ("sa_jobqueue", *TAGGED, *PEERS, "pgqueuer_psycopg", "reference"),
    # sa_jobqueue with 2 handler threads a process beside its default of 10: for short jobs
    # that write, fewer threads (and so fewer connections) cost less on a machine of 2 cores.
    "write": ("sa_jobqueue", "sa_jobqueue_c2", *TAGGED, *PEERS, "pgqueuer_psycopg", "reference"),
    "latency": ("sa_jobqueue", *(p for p in PEERS if p != "pgqueuer_b500")),
    "history": ("sa_jobqueue", "procrastinate", "pgqueuer", *BEST, "reference"),
    "pinned": ("sa_jobqueue", "procrastinate", "pgqueuer", *BEST, "reference"),
    # procrastinate is left out: at about 200 jobs/s its drains of 20,000 are all cut at the
    # time cap, and with its million-job preload they took four of the scenario's six minutes.
    "backlog": ("sa_jobqueue", "pgqueuer_b100", "reference"),
    # sa_jobqueue's async def handlers beside the same handlers written sync: no peer.
    "async": ("sa_jobqueue",),
    # Handlers that take their jobs in batches and write each batch with one INSERT. No peer
    # offers such a handler: PgQueuer's batch_size batches its dequeue and acknowledgements,
    # but calls its handler once per job; procrastinate and Chancy document none either. The
    # reference loop's write drain is one already (a claimed batch, one INSERT, one commit).
    "batch-write": ("sa_jobqueue", "reference"),
    # More worker processes against one server: the no-op, writing and batch-writing drains
    # at each count of --scale-procs, with the backends' sampled wait events.
    "scale": ("sa_jobqueue", "pgqueuer_b100", "reference"),
}
SCENARIOS = tuple(SCENARIO_SYSTEMS)
#: The async scenario's pairs: (measure, sync kind, async kind), each the same handler.
ASYNC_PAIRS = (
    ("noop", "noop", "noop_async"),
    ("write", "write", "write_async"),
    ("1ms", "sleep_1ms", "sleep_1ms_async"),
)
#: Systems run only when named with --systems (the configuration earlier runs used).
OPT_IN = ("pgqueuer_psycopg", *TAGGED)
DEFAULT_SYSTEMS = tuple(k for k in SYSTEMS if k not in OPT_IN)


# -- options ----------------------------------------------------------------------------------


def _procs(text: str) -> list[int]:
    return [int(p) for p in text.split(",") if p]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/run", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke run of minutes")
    p.add_argument("--repeat", type=int, help="repetitions per measurement (default 3; quick 1)")
    p.add_argument("--scenarios", default=",".join(SCENARIOS),
                   help="comma-separated subset")  # fmt: skip
    p.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS),
                   help=f"comma-separated subset (opt-in: {', '.join(OPT_IN)})")  # fmt: skip
    p.add_argument("--single", type=int, help="single-row enqueues (default 2000)")
    p.add_argument("--bulk", type=int, help="jobs in the bulk enqueue (default 20000)")
    p.add_argument("--bulk-batch", type=int, default=1000,
                   help="jobs per transaction in the bulk enqueue (default 1000)")  # fmt: skip
    p.add_argument("--drain", type=int, help="jobs per no-op / writing drain (default 20000)")
    p.add_argument("--drain-procs", type=_procs, default=[1, 2, 4],
                   help="worker processes of the no-op drains (default 1,2,4)")  # fmt: skip
    p.add_argument("--write-procs", type=_procs, default=[2],
                   help="worker processes of the writing drains (default 2)")  # fmt: skip
    p.add_argument("--scale-procs", type=_procs, default=[1, 2, 4, 8, 16],
                   help="worker processes of the scale scenario's drains (default"
                   " 1,2,4,8,16)")  # fmt: skip
    p.add_argument("--scale-kinds", type=lambda v: v.split(","), default=list(report.SCALE_KINDS),
                   help="drains of the scale scenario (default "
                   + ",".join(report.SCALE_KINDS) + ")")  # fmt: skip
    p.add_argument("--scale-drain", type=int,
                   help="jobs per drain of the scale scenario (default 20000)")  # fmt: skip
    p.add_argument("--procs", type=int, default=2, help="worker processes in the history,"
                   " pinned and backlog drains (default 2)")  # fmt: skip
    p.add_argument("--latency-jobs", type=int, help="jobs in the latency run (default 200)")
    p.add_argument("--latency-rate", type=float, default=20.0, help="jobs/s (default 20)")
    p.add_argument("--history", type=int, help="finished rows pre-inserted (default 1000000)")
    p.add_argument("--history-drain", type=int, help="jobs drained over it (default 40000)")
    p.add_argument("--pinned", type=int, help="jobs in the pinned-snapshot drain (default 200000)")
    p.add_argument("--backlog", type=_procs,
                   help="queued jobs before each backlog drain (default 1000,10000,100000,1000000;"
                   " quick 1000,10000,50000)")  # fmt: skip
    p.add_argument("--backlog-drain", type=int, help="jobs drained out of each backlog"
                   " (default 20000; quick 5000; all of a smaller backlog)")  # fmt: skip
    p.add_argument("--max-drain-seconds", type=float,
                   help="cut a drain short after this long (default 10; quick 8): slow systems "
                   "are measured over what they finished by then")  # fmt: skip
    p.add_argument("--results-dir", type=Path, default=RESULTS_DIR,
                   help="where the raw result goes (bench/results: not committed)")  # fmt: skip
    p.add_argument("--publish", action="store_true",
                   help="also write the raw result to bench/runs/ (committed), for the docs'"
                   " figures; refused unless this is a full run")  # fmt: skip
    p.add_argument("--sa-concurrency", type=int, default=10,
                   help="sa_jobqueue worker --concurrency (default 10: the CLI's)")  # fmt: skip
    p.add_argument("--async-concurrency", type=int, default=16,
                   help="--concurrency in the async scenario (default 16)")  # fmt: skip
    args = p.parse_args(argv)
    quick = args.quick
    defaults = {
        "repeat": 1 if quick else 3,
        "single": 500 if quick else 2_000,
        "bulk": 5_000 if quick else 20_000,
        "drain": 5_000 if quick else 20_000,
        "scale_drain": 5_000 if quick else 20_000,
        "latency_jobs": 40 if quick else 200,
        "history": 200_000 if quick else 1_000_000,
        "history_drain": 5_000 if quick else 40_000,
        "pinned": 20_000 if quick else 200_000,
        "backlog": [1_000, 10_000, 50_000] if quick else [1_000, 10_000, 100_000, 1_000_000],
        "backlog_drain": 5_000 if quick else 20_000,
        "max_drain_seconds": 8.0 if quick else 10.0,
    }
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.scenarios = [s for s in args.scenarios.split(",") if s]
    args.systems = [s for s in args.systems.split(",") if s]
    for name in args.scenarios:
        if name not in SCENARIO_SYSTEMS:
            p.error(f"unknown scenario {name!r} (known: {', '.join(SCENARIOS)})")
    for name in args.systems:
        if name not in SYSTEMS:
            p.error(f"unknown system {name!r} (known: {', '.join(SYSTEMS)})")
    if args.publish and not is_full_run(args):
        p.error("--publish takes only a full run: no --quick, and every option at its default")
    return args


def is_full_run(args: argparse.Namespace) -> bool:
    """True when ``args`` are the defaults: every scenario, system and size (--publish aside)."""
    full = parse_args([])
    ignored = {"publish", "results_dir"}
    return all(getattr(args, k) == v for k, v in vars(full).items() if k not in ignored)


def command_line(argv: list[str] | None) -> str:
    """The command as typed: bench/run exports it; else this script and its arguments."""
    given = os.environ.get("BENCH_COMMAND")
    if given:
        return given
    args = sys.argv[1:] if argv is None else argv
    return shlex.join(["python", "bench/bench.py", *args])


def git_state() -> dict[str, Any]:
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    return {"commit": git("rev-parse", "HEAD") or "unknown", "dirty": bool(git("status",
            "--porcelain", "--untracked-files=no"))}  # fmt: skip


# -- the server -------------------------------------------------------------------------------


@contextmanager
def server_url() -> Iterator[tuple[str, str]]:
    """($DATABASE_URL or an embedded server's URL, a description of which)."""
    configured = os.environ.get("DATABASE_URL")
    if configured:
        yield harness.plain_url(configured), "DATABASE_URL"
        return
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    import pgserver

    server = pgserver.get_server(ROOT / ".bench-pgdata", cleanup_mode="stop")
    try:
        yield server.get_uri(), "embedded pgserver (.bench-pgdata/)"
    finally:
        server.cleanup()


#: The server settings a reader needs to judge the figures.
SETTINGS = (
    "synchronous_commit", "fsync", "wal_sync_method", "commit_delay", "shared_buffers",
    "max_connections", "wal_level", "max_wal_size", "checkpoint_timeout", "autovacuum",
    "work_mem", "jit",
)  # fmt: skip


def machine_info(url: str, where: str) -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    with psycopg.connect(url, autocommit=True) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
        values = {s: conn.execute(f"SHOW {s}").fetchone()[0] for s in SETTINGS}  # type: ignore[index]
    versions = {s.label: s.version() for s in SYSTEMS.values() if s.distribution}
    versions = {k.split(" (")[0]: v for k, v in versions.items()}
    for dist in ("psycopg", "asyncpg", "uvloop", "SQLAlchemy"):
        versions[dist] = _version(dist)
    return {
        "host": socket.gethostname(),
        "cores": os.cpu_count(),
        "ram_gib": round(ram_gib, 1),
        "cpu": cpu,
        "kernel": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "postgresql": version,
        "server": where,
        "settings": values,
        "versions": versions,
        "load_average": {"start": round(os.getloadavg()[0], 2)},
    }


def _version(distribution: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


# -- running and collecting -------------------------------------------------------------------


@dataclass
class Row:
    """One system's results in one scenario: named measurements, each over repetitions."""

    system: System
    samples: dict[str, list[float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    failures: int = 0  # runs with a verification failure
    error: str | None = None
    raw: list[dict[str, Any]] = field(default_factory=list)

    def add(self, measure: str, value: float) -> None:
        self.samples.setdefault(measure, []).append(value)

    def median(self, measure: str) -> float:
        values = [v for v in self.samples.get(measure, []) if not math.isnan(v)]
        return statistics.median(values) if values else float("nan")

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def as_dict(self) -> dict[str, Any]:
        return {
            "system": self.system.key,
            "label": self.system.label,
            "error": self.error,
            "failures": self.failures,
            "notes": self.notes,
            "medians": {m: self.median(m) for m in self.samples},
            "samples": self.samples,
            "runs": self.raw,
        }


class Run:
    def __init__(self, args: argparse.Namespace, url: str):
        self.args = args
        self.url = url
        self.tables: dict[str, list[Row]] = {}

    def scenario(self, name: str, body: Callable[[Row, str], None]) -> None:
        """Run ``body`` per system in a fresh database of its own."""
        rows: list[Row] = []
        self.tables[name] = rows
        for key in SCENARIO_SYSTEMS[name]:
            if key not in self.args.systems:
                continue
            row = Row(SYSTEMS[key])
            rows.append(row)
            reason = row.system.unavailable()
            if reason is not None:
                row.error = f"unavailable: {reason}"
                print(f"  {key}: {row.error}", flush=True)
                continue
            # The pid keeps two runs on one server (two checkouts) out of each other's way.
            db = f"bench_{name}_{key}_{os.getpid()}"
            started = time.monotonic()
            try:
                dsn = harness.recreate_database(self.url, db)
                row.system.install(dsn)
                body(row, dsn)
            except Exception as exc:
                row.error = f"error: {type(exc).__name__}: {str(exc).strip()[:200]}"
            finally:
                try:
                    harness.drop_database(self.url, db)
                except Exception as exc:
                    print(f"  (could not drop {db}: {exc})", file=sys.stderr)
            status = row.error or "ok"
            print(f"  {key}: {status} ({time.monotonic() - started:.0f}s)", flush=True)

    def record_drain(self, row: Row, measure: str, result: harness.Drain) -> None:
        row.raw.append({"measure": measure, **result.as_dict()})
        row.add(measure, result.rate)
        if not result.verified:
            row.failures += 1
            row.note(
                f"{measure}: {result.duplicates} duplicate(s), {result.missing} missing"
                + (f", {result.error}" if result.error else "")
            )
        if not result.complete and result.error is None:
            row.note(
                f"{measure}: cut at {self.args.max_drain_seconds:g}s"
                f" ({result.finished}/{result.jobs} done)"
            )
        if result.peak_rss_mb:
            row.add(f"{measure} rss", max(result.peak_rss_mb))
        row.add(f"{measure} worker cpu", result.worker_us_per_job)
        row.add(f"{measure} db cpu", result.db_us_per_job)
        if result.ready != "idle":
            row.note(f"{measure}: workers {result.ready}")

    def drain(self, row: Row, dsn: str, measure: str, jobs: int, **options: Any) -> None:
        for _ in range(self.args.repeat):
            result = harness.drain(
                row.system, dsn, jobs, cap=self.args.max_drain_seconds, **options
            )
            self.record_drain(row, measure, result)
            if result.error is not None:
                break


# -- scenarios --------------------------------------------------------------------------------


def scenario_enqueue(run: Run, row: Row, dsn: str) -> None:
    n = run.args.single
    for _ in range(run.args.repeat):
        row.system.reset(dsn)
        with row.system.producer(dsn, "noop") as enqueue:
            enqueue(-1)  # connect and warm up outside the clock
            cpu = time.process_time()
            seconds = harness.timed(lambda: [enqueue(i) for i in range(n)] and None)
            cpu = time.process_time() - cpu
        row.add("jobs/s", n / seconds)
        row.add("cpu", cpu / n * 1e6)
        row.raw.append({"jobs": n, "seconds": seconds, "client_cpu_seconds": cpu})


def scenario_bulk(run: Run, row: Row, dsn: str) -> None:
    n, batch = run.args.bulk, run.args.bulk_batch
    for _ in range(run.args.repeat):
        row.system.reset(dsn)
        cpu = time.process_time()
        seconds = harness.timed(lambda: row.system.enqueue_bulk(dsn, range(n), "noop", batch))
        cpu = time.process_time() - cpu
        row.add("jobs/s", n / seconds)
        row.add("cpu", cpu / n * 1e6)
        row.raw.append({"jobs": n, "batch": batch, "seconds": seconds, "client_cpu_seconds": cpu})


def scenario_drain(run: Run, row: Row, dsn: str) -> None:
    for procs in run.args.drain_procs:
        run.drain(row, dsn, f"{procs}p", run.args.drain, procs=procs)


def scenario_write(run: Run, row: Row, dsn: str) -> None:
    for procs in run.args.write_procs:
        run.drain(row, dsn, f"{procs}p", run.args.drain, kind="write", procs=procs)


def scenario_batch_write(run: Run, row: Row, dsn: str) -> None:
    for procs in run.args.write_procs:
        run.drain(row, dsn, f"{procs}p", run.args.drain, kind="batch_write", procs=procs)


def scenario_latency(run: Run, row: Row, dsn: str) -> None:
    for _ in range(run.args.repeat):
        result = harness.pickup_latency(
            row.system, dsn, run.args.latency_jobs, run.args.latency_rate
        )
        row.raw.append(result.as_dict())
        for q in (50, 95, 99):
            row.add(f"p{q}", result.percentile(q))
        if not result.verified:
            row.failures += 1
            row.note(
                f"{result.lost} lost, {result.duplicates} duplicate(s)"
                + (f", {result.error}" if result.error else "")
            )


def scenario_history(run: Run, row: Row, dsn: str) -> None:
    jobs, procs = run.args.history_drain, run.args.procs
    run.drain(row, dsn, "empty", jobs, procs=procs)
    row.system.reset(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(row.system.history_sql, {"n": run.args.history})  # type: ignore[arg-type]
        # What autovacuum would long have done to rows that old (it is off on some servers):
        # hint bits and the visibility map set once, so the drain measures the claim over the
        # history, not a one-off write-back of pages the history's first readers dirty.
        conn.execute("VACUUM (ANALYZE)")
    # The finished rows stay for every repetition (each adds its own drained jobs to them).
    run.drain(row, dsn, "history", jobs, procs=procs, reset=False)


def scenario_pinned(run: Run, row: Row, dsn: str) -> None:
    jobs, procs = run.args.pinned, run.args.procs
    run.drain(row, dsn, "free", jobs, procs=procs)
    run.drain(row, dsn, "pinned", jobs, procs=procs, pin_snapshot=True)


def scenario_backlog(run: Run, row: Row, dsn: str) -> None:
    # One run per larger size, whatever --repeat says: a million-job preload is the slow part,
    # and CPU per job over 20,000 jobs varies far less than the rate does. A drain cut short
    # counts the jobs finished when the workers were stopped, and its CPU includes the claims
    # of the few still in flight then (a few percent of 20,000 jobs).
    # A backlog no larger than --backlog-drain is drained whole, to its last completion, and
    # (up to 5 times) as often as it takes to drain that many jobs in all: the median of a
    # few drains of a thousand jobs, each a few tens of milliseconds of CPU.
    drained = run.args.backlog_drain
    for size in run.args.backlog:
        whole = size <= drained
        for _ in range(min(5, math.ceil(drained / size)) if whole else 1):
            result = harness.drain(
                row.system,
                dsn,
                size,
                procs=run.args.procs,
                cap=run.args.max_drain_seconds,
                stop_after=None if whole else drained,
            )
            run.record_drain(row, report.backlog_key(size), result)
            if result.error is not None:
                return


def scenario_async(run: Run, row: Row, dsn: str) -> None:
    # One worker process, --async-concurrency handlers at once, each pair's sync and async
    # drains one after the other, the pairs in turn in each repetition: a change of the
    # machine's load over the run falls on both sides of each pair alike.
    system = row.system
    usual = system.concurrency  # type: ignore[attr-defined]
    system.concurrency = run.args.async_concurrency  # type: ignore[attr-defined]
    try:
        for _ in range(run.args.repeat):
            for measure, sync_kind, async_kind in ASYNC_PAIRS:
                for side, kind in (("sync", sync_kind), ("async", async_kind)):
                    result = harness.drain(
                        system, dsn, run.args.drain, kind=kind, cap=run.args.max_drain_seconds
                    )
                    run.record_drain(row, f"{measure} {side}", result)
                    if result.error is not None:
                        return
    finally:
        system.concurrency = usual  # type: ignore[attr-defined]


def scenario_scale(run: Run, row: Row, dsn: str) -> None:
    # One run per cell: five process counts of three drains are the scenario's cost, and the
    # rate's trend over the counts, not one cell's noise, is what it shows.
    for kind in run.args.scale_kinds:
        if kind == "batch_write" and row.system.key not in SCENARIO_SYSTEMS["batch-write"]:
            continue  # no batch handlers (PgQueuer's write drain is its line)
        for procs in run.args.scale_procs:
            result = harness.drain(
                row.system,
                dsn,
                run.args.scale_drain,
                kind=kind,
                procs=procs,
                cap=run.args.max_drain_seconds,
                sample_waits=True,
            )
            run.record_drain(row, f"{kind} {procs}p", result)
            if result.error is not None:
                return


SCENARIO_BODIES: dict[str, Callable[[Run, Row, str], None]] = {
    "enqueue": scenario_enqueue,
    "bulk": scenario_bulk,
    "drain": scenario_drain,
    "write": scenario_write,
    "latency": scenario_latency,
    "history": scenario_history,
    "pinned": scenario_pinned,
    "backlog": scenario_backlog,
    "async": scenario_async,
    "batch-write": scenario_batch_write,
    "scale": scenario_scale,
}


def describe_sizes(args: argparse.Namespace) -> dict[str, str]:
    r = f"median of {args.repeat}"
    return {
        "enqueue": f"({args.single:,} jobs, {r})",
        "bulk": f"({args.bulk:,} jobs, {r})",
        "drain": f"({args.drain:,} jobs, {r})",
        "write": f"({args.drain:,} jobs, {r})",
        "batch-write": f"({args.drain:,} jobs, {r})",
        "latency": f"({args.latency_jobs} jobs at {args.latency_rate:g}/s, 1 process, {r})",
        "history": f"({args.history_drain:,} jobs over {args.history:,} finished rows,"
        f" {args.procs} processes, {r})",
        "pinned": f"({args.pinned:,} jobs, {args.procs} processes, {r})",
        "backlog": f"({args.backlog_drain:,} jobs out of each larger backlog, {args.procs}"
        " processes, one run each; a smaller one drained whole, median of up to 5)",
        "async": f"({args.drain:,} jobs, 1 process, --concurrency {args.async_concurrency}, {r})",
        "scale": f"({args.scale_drain:,} jobs a drain, one run each)",
    }


def describe_system(system: System) -> dict[str, Any]:
    return {"label": system.label, "config": system.config, "peer": system.peer}


# -- main -------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sa = SYSTEMS["sa_jobqueue"]
    sa.concurrency = args.sa_concurrency  # type: ignore[attr-defined]
    sa.config = f"sa-jobqueue worker --concurrency {args.sa_concurrency}"  # type: ignore[misc]
    command = command_line(argv)
    started_at = datetime.now(UTC)
    started = time.monotonic()
    with server_url() as (url, where):
        info = machine_info(url, where)
        used = [k for k in SYSTEMS if k in args.systems]
        document: report.Document = {
            "format": 2,
            "command": command,
            "git": git_state(),
            "started": started_at.isoformat(timespec="seconds"),
            "full_run": is_full_run(args),
            "info": info,
            "options": {k: v for k, v in vars(args).items() if k != "results_dir"},
            "systems": {k: describe_system(SYSTEMS[k]) for k in used},
            "sizes": describe_sizes(args),
            "scenarios": {},
        }
        print(report.render_info(document), flush=True)
        run = Run(args, url)
        for name in args.scenarios:
            print(f"\n[{report.TITLES[name]}]", flush=True)
            run.scenario(name, lambda row, dsn, body=SCENARIO_BODIES[name]: body(run, row, dsn))
    info["load_average"]["end"] = round(os.getloadavg()[0], 2)
    document["minutes"] = (time.monotonic() - started) / 60
    document["scenarios"] = {
        name: [row.as_dict() for row in rows] for name, rows in run.tables.items()
    }
    report.add_ratios(document)
    print()
    for name in document["scenarios"]:
        print(report.render_scenario(name, document))
        print()
    print(f"Total time: {document['minutes']:.1f} min")
    text = json.dumps(document, indent=2, default=str) + "\n"
    args.results_dir.mkdir(parents=True, exist_ok=True)
    path = args.results_dir / f"{started_at.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(text)
    print(f"Results: {path}")
    if args.publish:
        RUNS_DIR.mkdir(parents=True, exist_ok=True)
        published = RUNS_DIR / f"{started_at.strftime('%Y-%m-%d')}-{info['host']}.json"
        published.write_text(text)
        name = published.relative_to(ROOT)
        print(f"Published: {name} (the docs' table: bench/.venv/bin/python"
              f" bench/readme_table.py {name})")  # fmt: skip
    failed = any(row.failures for rows in run.tables.values() for row in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
