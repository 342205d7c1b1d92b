"""sa_jobqueue next to procrastinate, PgQueuer and Chancy, on one PostgreSQL, in one run.

    bench/run [--quick] [--repeat N] [--scenarios enqueue,bulk,...] [--systems ...]

Uses $DATABASE_URL's server (each system gets fresh databases of its own there, created and
dropped by the run), or else an embedded PostgreSQL from the ``pgserver`` wheel. Prints the
machine, the server's settings, the versions and one table per scenario; writes everything
to bench/results/<timestamp>.json as well.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
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

from bench import harness  # noqa: E402
from bench.adapters.base import System  # noqa: E402
from bench.systems import SYSTEMS  # noqa: E402

RESULTS_DIR = ROOT / "bench" / "results"
PEERS = ("procrastinate", "pgqueuer", "pgqueuer_b100", "chancy", "chancy_tuned")

#: Which systems take part in which scenario (an enqueue is the same for a system's tunings).
ENQUEUERS = ("sa_jobqueue", "procrastinate", "pgqueuer", "chancy", "reference")
SCENARIO_SYSTEMS: dict[str, tuple[str, ...]] = {
    "enqueue": ENQUEUERS,
    "bulk": ENQUEUERS,
    "drain": ("sa_jobqueue", *PEERS, "reference"),
    "write": ("sa_jobqueue", "procrastinate", "pgqueuer", "pgqueuer_b100", "chancy_tuned"),
    "latency": ("sa_jobqueue", "procrastinate", "pgqueuer", "chancy_tuned"),
    "history": ("sa_jobqueue", "procrastinate", "pgqueuer", "pgqueuer_b100", "chancy_tuned",
                "reference"),
    "pinned": ("sa_jobqueue", "procrastinate", "pgqueuer", "pgqueuer_b100", "chancy_tuned",
               "reference"),
}  # fmt: skip
SCENARIOS = tuple(SCENARIO_SYSTEMS)


# -- options ----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/run", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes: a ~2-minute smoke run")
    p.add_argument("--repeat", type=int, help="repetitions per measurement (default 3; quick 1)")
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated subset")
    p.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset")
    p.add_argument("--single", type=int, help="single-row enqueues (default 2000)")
    p.add_argument("--bulk", type=int, help="jobs in the bulk enqueue (default 20000)")
    p.add_argument("--bulk-batch", type=int, default=1000,
                   help="jobs per transaction in the bulk enqueue (default 1000)")  # fmt: skip
    p.add_argument("--drain", type=int, help="jobs per no-op / writing drain (default 20000)")
    p.add_argument("--procs", type=int, default=2, help="worker processes in the writing, "
                   "history and pinned drains (default 2)")  # fmt: skip
    p.add_argument("--latency-jobs", type=int, help="jobs in the latency run (default 200)")
    p.add_argument("--latency-rate", type=float, default=20.0, help="jobs/s (default 20)")
    p.add_argument("--history", type=int, help="finished rows pre-inserted (default 1000000)")
    p.add_argument("--history-drain", type=int, help="jobs drained over it (default 40000)")
    p.add_argument("--pinned", type=int, help="jobs in the pinned-snapshot drain (default 200000)")
    p.add_argument("--max-drain-seconds", type=float,
                   help="cut a drain short after this long (default 10; quick 8): slow systems "
                   "are measured over what they finished by then")  # fmt: skip
    p.add_argument("--results-dir", type=Path, default=RESULTS_DIR,
                   help="where the JSON results go (default bench/results)")  # fmt: skip
    p.add_argument("--sa-concurrency", type=int, default=10,
                   help="sa_jobqueue worker --concurrency (default 10: the CLI's)")  # fmt: skip
    args = p.parse_args(argv)
    quick = args.quick
    defaults = {
        "repeat": 1 if quick else 3,
        "single": 500 if quick else 2_000,
        "bulk": 5_000 if quick else 20_000,
        "drain": 5_000 if quick else 20_000,
        "latency_jobs": 40 if quick else 200,
        "history": 200_000 if quick else 1_000_000,
        "history_drain": 5_000 if quick else 40_000,
        "pinned": 20_000 if quick else 200_000,
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
    return args


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
    settings = (
        "synchronous_commit",
        "fsync",
        "shared_buffers",
        "max_connections",
        "wal_level",
        "autovacuum",
    )
    with psycopg.connect(url, autocommit=True) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
        values = {s: conn.execute(f"SHOW {s}").fetchone()[0] for s in settings}  # type: ignore[index]
    return {
        "cores": os.cpu_count(),
        "ram_gib": round(ram_gib, 1),
        "cpu": cpu,
        "python": platform.python_version(),
        "postgresql": version,
        "server": where,
        "settings": values,
        "versions": {s.label: s.version() for s in SYSTEMS.values() if s.distribution},
    }


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
            db = f"bench_{name}_{key}"
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
    for procs in (1, 2):
        run.drain(row, dsn, f"{procs}p", run.args.drain, procs=procs)


def scenario_write(run: Run, row: Row, dsn: str) -> None:
    run.drain(row, dsn, "write", run.args.drain, kind="write", procs=run.args.procs)


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


SCENARIO_BODIES: dict[str, Callable[[Run, Row, str], None]] = {
    "enqueue": scenario_enqueue,
    "bulk": scenario_bulk,
    "drain": scenario_drain,
    "write": scenario_write,
    "latency": scenario_latency,
    "history": scenario_history,
    "pinned": scenario_pinned,
}


# -- tables -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    title: str
    measure: str
    unit: str = "jobs/s"  # or "ms", "MiB", "µs/job"
    ratio: bool = False  # also show the ratio to the best peer

    @property
    def lower_is_better(self) -> bool:
        return self.unit in ("ms", "µs/job")


COLUMNS: dict[str, tuple[Column, ...]] = {
    "enqueue": (
        Column("jobs/s", "jobs/s", ratio=True),
        Column("client CPU", "cpu", unit="µs/job", ratio=True),
    ),
    "bulk": (
        Column("jobs/s", "jobs/s", ratio=True),
        Column("client CPU", "cpu", unit="µs/job", ratio=True),
    ),
    "drain": (
        Column("1 process", "1p", ratio=True),
        Column("2 processes", "2p", ratio=True),
        Column("peak RSS/proc", "2p rss", unit="MiB"),
    ),
    "write": (Column("jobs/s", "write", ratio=True), Column("peak RSS/proc", "write rss", "MiB")),
    "latency": (
        Column("p50", "p50", unit="ms", ratio=True),
        Column("p95", "p95", unit="ms"),
        Column("p99", "p99", unit="ms", ratio=True),
    ),
    "history": (
        Column("empty table", "empty", ratio=True),
        Column("with history", "history", ratio=True),
    ),
    "pinned": (
        Column("no snapshot", "free", ratio=True),
        Column("snapshot pinned", "pinned", ratio=True),
    ),
}

TITLES = {
    "enqueue": "1. single-row enqueue, one commit each",
    "bulk": "2. bulk enqueue, one batch call per transaction",
    "drain": "3. drain of pre-loaded no-op jobs",
    "write": "4. drain of jobs whose handler writes one row",
    "latency": "5. idle pickup latency (enqueue commit -> handler start)",
    "history": "6. drain with finished history in the table",
    "pinned": "7. sustained drain while a REPEATABLE READ snapshot is held open",
}

FOOTNOTES = {
    "enqueue": "sa_jobqueue: a Session per job, enqueue, commit (BEGIN, INSERT, COMMIT: three"
    " round trips); pgqueuer: Queries.enqueue on an autocommit connection (one statement, no"
    " transaction of the caller's to join); procrastinate: defer_async; chancy: push;"
    " reference = a raw psycopg INSERT + COMMIT into a minimal table (three round trips)."
    " Client CPU = the enqueuing process's CPU time (its event loop included), not the"
    " server's.",
    "bulk": "Each batch is one transaction. sa_jobqueue: enqueue_many (by COPY from 200 jobs);"
    " procrastinate: batch_defer_async; pgqueuer: Queries.enqueue with lists; chancy:"
    " push_many(batch_size=batch); reference: INSERT ... SELECT unnest(array) + COMMIT into"
    " a minimal table.",
    "drain": "reference = hand-written loop: claim 100 with one UPDATE ... FOR UPDATE SKIP LOCKED"
    " ... RETURNING, mark them done with one UPDATE ... = ANY(ids), autocommit (the ceiling).",
    "write": "Not the same guarantee: sa_jobqueue's row is written through ctx.session and commits"
    " in the job's completion transaction (exactly once). The peers' handlers write on a"
    " connection of their own in a separate transaction, so a crash between the write and"
    " the job's completion repeats the write (at-least-once).",
    "latency": "Handler start = time.time() in the handler; enqueue = time.time() when the"
    " enqueuing COMMIT returned. One machine, one clock (PostgreSQL's clock_timestamp() reads the"
    " same realtime clock).",
    "history": "History inserted with one INSERT ... SELECT generate_series in each system's table"
    " of finished jobs, then ANALYZE (PgQueuer deletes finished jobs: its history is"
    " pgqueuer_log rows).",
    "pinned": "'slowdown' = no-snapshot rate / pinned rate. The snapshot is taken after the"
    " jobs are loaded and held until the drain ends: no dead row version can be vacuumed.",
}


def fmt(value: float, unit: str) -> str:
    if math.isnan(value):
        return "-"
    if unit == "ms":
        return f"{value:.2f}"
    if unit == "MiB":
        return f"{value:.0f}"
    if unit == "µs/job":
        return f"{value:,.1f}"
    return f"{value:,.0f}"


def render(name: str, rows: list[Row], args: argparse.Namespace) -> str:
    columns = COLUMNS[name]
    best: dict[str, float] = {}
    for col in columns:
        values = [
            r.median(col.measure) for r in rows if r.system.peer and r.failures == 0 and not r.error
        ]
        values = [v for v in values if not math.isnan(v)]
        if values:
            best[col.measure] = min(values) if col.lower_is_better else max(values)
    header = ["system"]
    for col in columns:
        header.append(f"{col.title} ({col.unit})")
        if col.ratio:
            header.append("vs best peer")
    extra = {"history": "change", "pinned": "slowdown"}.get(name)
    if extra:
        header.append(extra)
    header.append("verified")
    table = [header]
    notes: list[str] = []
    for row in rows:
        cells = [row.system.label]
        if row.error:
            table.append([*cells, row.error])
            continue
        for col in columns:
            value = row.median(col.measure)
            cells.append(fmt(value, col.unit))
            if col.ratio:
                top = best.get(col.measure)
                cells.append(f"{value / top:.2f}x" if top and not math.isnan(value) else "-")
        if name == "history":
            empty, full = row.median("empty"), row.median("history")
            cells.append(f"{(full / empty - 1) * 100:+.0f}%" if empty and full else "-")
        if name == "pinned":
            free, pinned = row.median("free"), row.median("pinned")
            cells.append(f"{free / pinned:.2f}x" if free and pinned else "-")
        cells.append("FAILED" if row.failures else "ok")
        table.append(cells)
        notes += [f"   {row.system.label}: {n}" for n in row.notes]
    full = [r for r in table if len(r) == len(header)]
    widths = [max(len(r[i]) for r in full) for i in range(len(header))]
    widths[0] = max(len(r[0]) for r in table)
    lines = [f"{TITLES[name]}  {describe_size(name, args)}"]
    for i, cells in enumerate(table):
        if len(cells) == 2 and len(header) > 2:  # an error spans the row
            lines.append(f"  {cells[0].ljust(widths[0])}  {cells[1]}")
        else:
            lines.append(
                "  "
                + "  ".join(
                    c.ljust(w) if j == 0 else c.rjust(w)
                    for j, (c, w) in enumerate(zip(cells, widths, strict=False))
                )
            )
        if i == 0:
            lines.append("  " + "  ".join("-" * w for w in widths))
    lines += notes
    lines.append(f"  Note: {FOOTNOTES[name]}")
    return "\n".join(lines)


def describe_size(name: str, args: argparse.Namespace) -> str:
    r = f"median of {args.repeat}"
    return {
        "enqueue": f"({args.single:,} jobs, {r})",
        "bulk": f"({args.bulk:,} jobs in transactions of {args.bulk_batch:,}, {r})",
        "drain": f"({args.drain:,} jobs, {r}; sa_jobqueue --concurrency {args.sa_concurrency})",
        "write": f"({args.drain:,} jobs, {args.procs} processes, {r})",
        "latency": f"({args.latency_jobs} jobs at {args.latency_rate:g}/s, 1 process, {r})",
        "history": f"({args.history_drain:,} jobs over {args.history:,} finished rows,"
        f" {args.procs} processes, {r})",
        "pinned": f"({args.pinned:,} jobs, {args.procs} processes, {r})",
    }[name]


def render_info(info: dict[str, Any], args: argparse.Namespace) -> str:
    settings = ", ".join(f"{k}={v}" for k, v in info["settings"].items())
    versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items())
    return "\n".join(
        [
            f"Machine: {info['cores']} cores, {info['ram_gib']} GiB RAM, {info['cpu']};"
            f" Python {info['python']}",
            f"PostgreSQL {info['postgresql']} ({info['server']}): {settings}",
            f"Versions: {versions}",
            f"Drains are cut after {args.max_drain_seconds:g}s (a cut drain counts the jobs"
            " finished by then); the clock runs from the first handler start to the moment no"
            " job is left unfinished. 'vs best peer': ratio to the best of procrastinate,"
            " PgQueuer and Chancy in that column (for latency, >1 is slower).",
        ]
    )


# -- main -------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    SYSTEMS["sa_jobqueue"].concurrency = args.sa_concurrency  # type: ignore[attr-defined]
    started = time.monotonic()
    with server_url() as (url, where):
        info = machine_info(url, where)
        print(render_info(info, args), flush=True)
        run = Run(args, url)
        for name in args.scenarios:
            print(f"\n[{TITLES[name]}]", flush=True)
            run.scenario(name, lambda row, dsn, body=SCENARIO_BODIES[name]: body(run, row, dsn))
    print()
    for name, rows in run.tables.items():
        print(render(name, rows, args))
        print()
    minutes = (time.monotonic() - started) / 60
    print(f"Total time: {minutes:.1f} min")
    args.results_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = args.results_dir / f"{stamp}.json"
    document = {
        "info": info,
        "options": {k: v for k, v in vars(args).items()},
        "minutes": minutes,
        "scenarios": {
            name: [
                {
                    "system": row.system.key,
                    "label": row.system.label,
                    "error": row.error,
                    "failures": row.failures,
                    "notes": row.notes,
                    "medians": {m: row.median(m) for m in row.samples},
                    "samples": row.samples,
                    "runs": row.raw,
                }
                for row in rows
            ]
            for name, rows in run.tables.items()
        },
    }
    path.write_text(json.dumps(document, indent=2, default=str) + "\n")
    print(f"Results: {path}")
    failed = any(row.failures for rows in run.tables.values() for row in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
