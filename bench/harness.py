"""Measuring one system in one database: enqueue timings, verified drains, pickup latency."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from bench import cpu, waits
from bench.adapters.base import WRITING, Kind, System
from bench.record import RECORD_DIR_ENV, Records, Tail

ROOT = Path(__file__).resolve().parent.parent
#: How often the harness reads the handlers' record files while jobs are still starting (s).
TAIL_POLL = 0.005
#: How often it asks the database whether a job is unfinished, once all have started (s).
POLL = 0.002
#: What a worker process gets to start (import, connect, warm up) before a drain.
STARTUP_ALLOWANCE = 30.0
#: The first key of the untimed warm-up jobs a drain starts with (System.warmup_per_process).
WARMUP_KEY = -10_000_000
#: What workers get to exit after SIGTERM before they are killed.
STOP_GRACE = 15.0


def plain_url(url: str) -> str:
    """``postgresql+driver://`` to the ``postgresql://`` every client here understands."""
    scheme, rest = url.split("://", 1)
    return "postgresql://" + rest if scheme.startswith(("postgresql", "postgres")) else url


def database_url(url: str, name: str) -> str:
    parts = urlsplit(plain_url(url))
    return urlunsplit(parts._replace(path="/" + name))


DROP = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")


def recreate_database(admin_url: str, name: str) -> str:
    """Drop and create database ``name`` on the server of ``admin_url``; return its URL."""
    with psycopg.connect(plain_url(admin_url), autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return database_url(admin_url, name)


def drop_database(admin_url: str, name: str) -> None:
    with psycopg.connect(plain_url(admin_url), autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@contextlib.contextmanager
def scratch_database(name: str) -> Iterator[str]:
    """Database ``name`` made afresh on $DATABASE_URL's server (the local one if unset) for
    the ``with`` block, and dropped after it; yields its URL. For the single-purpose scripts."""
    admin = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    dsn = recreate_database(admin, name)
    try:
        yield dsn
    finally:
        drop_database(admin, name)


def analyze(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        # Workers may be stopped (SIGSTOP) meanwhile: fail rather than wait on one's lock.
        conn.execute("SET lock_timeout = '30s'")
        conn.execute("ANALYZE")


def timed(action: Callable[[], None]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


# -- worker processes -------------------------------------------------------------------------


class Workers:
    """Worker processes of one system, each recording its handler runs under ``record_dir``."""

    def __init__(self, system: System, dsn: str, kind: Kind, count: int, record_dir: Path):
        env = {
            **os.environ,
            "BENCH_DSN": dsn,
            "DATABASE_URL": dsn,
            RECORD_DIR_ENV: str(record_dir),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        self.logs = [record_dir / f"worker-{i}.out" for i in range(count)]
        self.procs: list[subprocess.Popen[bytes]] = []
        for log in self.logs:
            with log.open("wb") as out:
                self.procs.append(
                    subprocess.Popen(
                        system.worker_argv(kind),
                        cwd=ROOT,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def pause(self) -> None:
        """SIGSTOP every worker's process group (each runs in a session of its own)."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, signum: int) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):  # it exited, its group is gone
                os.killpg(proc.pid, signum)
        # And every process of each tree: a child that leads a session of its own (a child of
        # ``sa-jobqueue worker --processes``) is in no group of these, and left running it
        # would drain the jobs while they are loaded, before the timed window.
        for pid in cpu.tree(self.pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def all_exited(self) -> bool:
        return all(p.poll() is not None for p in self.procs)

    def peak_rss_mb(self) -> list[float]:
        """Each process's peak resident set size (VmHWM), in MiB."""
        peaks = []
        for proc in self.procs:
            try:
                status = Path(f"/proc/{proc.pid}/status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("VmHWM:"):
                    peaks.append(int(line.split()[1]) / 1024)
        return peaks

    def stop(self) -> None:
        self.resume()  # a stopped process cannot act on SIGTERM
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        for proc in self.procs:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: children go too
                proc.wait()

    def tail(self, lines: int = 5) -> str:
        text = b"".join(log.read_bytes() for log in self.logs if log.exists())
        return " | ".join(text.decode(errors="replace").strip().splitlines()[-lines:])


# -- drains -----------------------------------------------------------------------------------


@dataclass
class Drain:
    jobs: int
    procs: int = 1
    finished: int = 0
    seconds: float = 0.0
    rate: float = 0.0
    complete: bool = False
    duplicates: int = 0  # extra runs of a job (and, for writing handlers, extra effects)
    missing: int = 0  # jobs finished without their handler having run (or its effect written)
    peak_rss_mb: list[float] = field(default_factory=list)
    #: From SIGCONT to the first handler start (not in ``seconds``).
    wake_seconds: float = 0.0
    #: From the last handler start to the end (the last completions' lag; in ``seconds``).
    tail_seconds: float = 0.0
    #: CPU (user + system) over the window, SIGCONT to the end: the worker processes and
    #: their children; the PostgreSQL backends serving them (None: not measurable here);
    #: the backend answering the harness's own polls.
    worker_cpu_seconds: float = 0.0
    db_cpu_seconds: float | None = None
    poll_cpu_seconds: float | None = None
    db_backends: int = 0
    vanished_backends: int = 0
    ready: str = ""  # how the workers were found ready before the window
    #: The backends' sampled wait events over the window (``bench.waits``), when asked for.
    waits: dict[str, Any] | None = None
    error: str | None = None

    @property
    def verified(self) -> bool:
        return self.error is None and self.duplicates == 0 and self.missing == 0

    @property
    def worker_us_per_job(self) -> float:
        return self.worker_cpu_seconds / self.finished * 1e6 if self.finished else float("nan")

    @property
    def db_us_per_job(self) -> float:
        if self.db_cpu_seconds is None or not self.finished:
            return float("nan")
        return self.db_cpu_seconds / self.finished * 1e6

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "verified": self.verified,
            "worker_us_per_job": self.worker_us_per_job,
            "db_us_per_job": self.db_us_per_job,
        }


def _pending_keys(conn: psycopg.Connection[Any], system: System) -> set[int]:
    return {row[0] for row in conn.execute(system.pending_sql)}  # type: ignore[arg-type]


def _wait_ready(
    system: System,
    workers: Workers,
    watch: psycopg.Connection[Any],
    exclude: list[int],
    tail: Tail,
    warmup: range,
) -> str | None:
    """Wait until the workers ran ``warmup``'s jobs and sit idle; None, or why not.

    Idle: as many database connections as processes at least, and the process trees used
    less than a quarter of a core each over the last half second.
    """
    deadline = time.monotonic() + STARTUP_ALLOWANCE
    window = 0.5
    procs = len(workers.procs)
    last = cpu.tree_snapshot(workers.pids)
    last_at = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        if workers.all_exited():
            return f"workers exited: {workers.tail()}"
        tail.update()
        if tail.started < len(warmup):
            continue
        if _pending_keys(watch, system) & set(warmup):
            continue
        if time.monotonic() - last_at < window:
            continue
        now = cpu.tree_snapshot(workers.pids)
        used = cpu.cpu_seconds(last, now).seconds
        last, last_at = now, time.monotonic()
        backends = cpu.backend_pids(watch, exclude)
        connected = backends is None or len(backends) >= procs
        connected = connected and system.all_up(watch, cpu.tree(workers.pids), procs)
        if connected and used < 0.25 * window * procs:
            return None
    return "not idle within the start-up allowance"


def drain(
    system: System,
    dsn: str,
    jobs: int,
    *,
    kind: Kind = "noop",
    procs: int = 1,
    cap: float,
    pin_snapshot: bool = False,
    reset: bool = True,
    stop_after: int | None = None,
    sample_waits: bool = False,
) -> Drain:
    """Start ``procs`` workers, let them warm up, then time them over ``jobs`` fresh jobs.

    The start line is the same for every system: the workers are started on an empty queue
    and run a few untimed warm-up jobs (connections open, pools and caches filled, process
    pools forked); once they are idle they are stopped (SIGSTOP), the jobs are loaded and
    ANALYZEd, and they are all continued (SIGCONT) at once. The clock runs from the first
    handler start to the moment the harness sees no unfinished job; CPU is counted from the
    SIGCONT to that moment. While jobs are still starting, the harness reads the handlers'
    record files and leaves the database alone; once every job has started it asks the
    database every ``POLL`` seconds whether one is still unfinished. After ``cap`` seconds
    the drain is cut short and the jobs finished by then count (``complete`` False).
    ``reset=False`` keeps the finished rows already in the tables (history).

    ``stop_after`` (backlog) ends the window once that many of the ``jobs`` have started: the
    workers are stopped (SIGSTOP) there, CPU is read, and the jobs finished by then count; the
    rest of the backlog stays queued. The database is not polled during such a window.

    ``sample_waits`` samples the backends' wait events over the window (``bench.waits``),
    on a connection whose backend's CPU is not counted.
    """
    result = Drain(jobs, procs)
    keys = range(jobs)
    counted: int | None = None  # with stop_after: the jobs finished in the window
    warmup = range(WARMUP_KEY, WARMUP_KEY + system.warmup_per_process * procs)
    if reset:
        system.reset(dsn)
    else:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("TRUNCATE bench_results")
    pending_exists = f"SELECT EXISTS ({system.pending_sql})"
    with (
        tempfile.TemporaryDirectory(prefix="bench-") as tmp,
        psycopg.connect(dsn, autocommit=True) as watch,
        psycopg.connect(dsn) as pinner,
        contextlib.ExitStack() as sampling,
    ):
        record_dir = Path(tmp)
        tail = Tail(record_dir, warmup)
        own = [watch.info.backend_pid, pinner.info.backend_pid]
        sampler = waits.WaitSampler(dsn) if sample_waits else None
        if sampler is not None:
            own.append(sampler.pid)
            sampling.callback(sampler.close)
        workers = Workers(system, dsn, kind, procs, record_dir)
        try:
            system.enqueue_bulk(dsn, warmup, kind)
            why = _wait_ready(system, workers, watch, own, tail, warmup)
            if why is not None and workers.all_exited():
                result.error = why
                return result
            result.ready = why or "idle"
            workers.pause()
            system.enqueue_bulk(dsn, keys, kind)
            analyze(dsn)
            if pin_snapshot:
                # As a long analytics query does: a snapshot taken and held, so no row
                # version deleted or updated from now on can be vacuumed away until it ends.
                pinner.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                pinner.execute("SELECT count(*) FROM bench_results").fetchone()
            backends = cpu.backend_pids(watch, own)
            tail = Tail(record_dir, keys)
            tail.update()  # the warm-up's lines, read once
            before = cpu.tree_snapshot(workers.pids)
            db_before = cpu.snapshot(backends or [])
            poll_before = cpu.snapshot([watch.info.backend_pid])
            resumed = time.time()
            if sampler is not None:
                sampler.start()
            workers.resume()
            first: float | None = None
            while True:
                done_at = time.time()
                if stop_after is not None and tail.started >= stop_after:
                    workers.pause()
                    result.complete = True
                    break
                if tail.started >= jobs:
                    if not watch.execute(pending_exists).fetchone()[0]:  # type: ignore[index]
                        result.complete = True
                        break
                    time.sleep(POLL)
                else:
                    time.sleep(TAIL_POLL)
                    tail.update()
                if workers.all_exited():
                    result.error = f"workers exited: {workers.tail()}"
                    break
                if first is None:
                    first = tail.first
                if done_at - (first or resumed) > cap + (0 if first else STARTUP_ALLOWANCE):
                    break
            after = cpu.tree_snapshot(workers.pids)
            if sampler is not None:
                sampler.close()
                result.waits = sampler.as_dict()
            result.worker_cpu_seconds = cpu.cpu_seconds(before, after).seconds
            if backends is not None:
                # Connections opened during the window count whole.
                window = cpu.cpu_seconds(
                    db_before, cpu.snapshot(cpu.backend_pids(watch, own) or [])
                )
                result.db_cpu_seconds = window.seconds
                result.db_backends = len(backends)
                result.vanished_backends = window.vanished
                result.poll_cpu_seconds = cpu.cpu_seconds(
                    poll_before, cpu.snapshot([watch.info.backend_pid])
                ).seconds
            result.peak_rss_mb = workers.peak_rss_mb()
            if stop_after is not None:
                # Counted while the workers are stopped: the jobs the window's CPU paid for.
                counted = jobs - len(set(keys) & _pending_keys(watch, system))
        finally:
            workers.stop()
            pinner.rollback()
        records = tail.update()
        first = tail.first
        pending = _pending_keys(watch, system)
        finished = set(keys) - pending
        ran = {k for k in records.runs if 0 <= k < jobs}
        result.finished = len(finished)
        result.duplicates = sum(c - 1 for k, c in records.runs.items() if c > 1 and 0 <= k < jobs)
        result.missing = len(finished - ran)
        if kind in WRITING:
            counts = dict(
                watch.execute(
                    "SELECT n, count(*) FROM bench_results WHERE n >= 0 GROUP BY n"
                ).fetchall()
            )
            result.duplicates += sum(c - 1 for c in counts.values() if c > 1)
            result.missing += len(finished - set(counts))
        if first is not None and result.finished:
            result.wake_seconds = max(first - resumed, 0.0)
            last = max(at for k, at in records.started.items() if 0 <= k < jobs)
            result.tail_seconds = max(done_at - last, 0.0)
            result.seconds = max(done_at - first, 1e-6)
            if counted is not None:
                result.finished = counted
            result.rate = result.finished / result.seconds
        elif result.error is None:
            result.error = f"no job ran: {workers.tail()}"
    return result


# -- idle pickup latency ----------------------------------------------------------------------


@dataclass
class Latency:
    jobs: int
    latencies_ms: list[float] = field(default_factory=list)
    lost: int = 0
    duplicates: int = 0
    error: str | None = None

    @property
    def verified(self) -> bool:
        return self.error is None and self.lost == 0 and self.duplicates == 0

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies_ms)
        if not ordered:
            return float("nan")
        return ordered[min(int(q / 100 * len(ordered)), len(ordered) - 1)]

    def as_dict(self) -> dict[str, Any]:
        return {
            "jobs": self.jobs,
            "p50_ms": self.percentile(50),
            "p95_ms": self.percentile(95),
            "p99_ms": self.percentile(99),
            "lost": self.lost,
            "duplicates": self.duplicates,
            "error": self.error,
            "verified": self.verified,
        }


def _wait_for(record_dir: Path, keys: set[int], timeout: float) -> Records:
    deadline = time.monotonic() + timeout
    while True:
        records = Records.read(record_dir)
        if keys <= records.runs.keys() or time.monotonic() > deadline:
            return records
        time.sleep(0.05)


def pickup_latency(system: System, dsn: str, jobs: int, rate: float) -> Latency:
    """Enqueue ``jobs`` jobs one at a time at ``rate``/s into one idle worker.

    Latency = the handler's start (``time.time()`` in the handler) minus the moment the
    enqueuing commit returned (``time.time()`` in the harness). Both read the machine's
    realtime clock, which is also PostgreSQL's clock here (a local server).
    """
    result = Latency(jobs)
    system.reset(dsn)
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        record_dir = Path(tmp)
        workers = Workers(system, dsn, "noop", 1, record_dir)
        try:
            with system.producer(dsn, "noop") as enqueue:
                # Warm up: the worker is up, listening and idle once this job has run.
                enqueue(-1)
                if -1 not in _wait_for(record_dir, {-1}, STARTUP_ALLOWANCE + 40).runs:
                    result.error = f"the worker never ran a job: {workers.tail()}"
                    return result
                time.sleep(1.0)
                committed: dict[int, float] = {}
                next_at = time.monotonic()
                for n in range(jobs):
                    enqueue(n)
                    committed[n] = time.time()
                    next_at += 1 / rate
                    time.sleep(max(next_at - time.monotonic(), 0))
            records = _wait_for(record_dir, set(range(jobs)), 30)
        finally:
            workers.stop()
        result.lost = sum(1 for n in range(jobs) if n not in records.runs)
        result.duplicates = sum(records.runs[n] - 1 for n in range(jobs) if records.runs[n] > 1)
        result.latencies_ms = [
            (records.started[n] - committed[n]) * 1000 for n in range(jobs) if n in records.started
        ]
    return result
