"""``sa-jobqueue verify``: the hammer test, run against your own database.

Run it where your workers run (the same server, the same pooler, the same network)::

    sa-jobqueue verify --jobs 10000 --workers 3

It creates a schema of its own, ``sa_jobqueue_verify_<12 hex digits>``, installs the queue's
tables there with the package's own Alembic revisions, starts W real worker processes
(``python -m sa_jobqueue worker sa_jobqueue.ops.verify_tasks:queue``) and enqueues N jobs. Once a
third of them have succeeded it SIGKILLs the worker holding the most claimed jobs and starts
another in its place, as a supervisor would. When every job has finished, or ``--timeout``
has passed, it stops the workers, counts, and drops the schema; also after an error, Ctrl-C or
SIGTERM (``--keep`` keeps it).

Each run of the handler leaves two records:

- a row in ``verify_runs``, written through an autocommit connection of its own before the
  work: every execution, those lost with the killed worker included (at-least-once execution);
- a row in ``verify_results``, written through ``ctx.session``: committed together with the
  job's fenced completion, so exactly one per succeeded job (exactly-once database effects).

The run passes (exit 0) when every job succeeded with exactly one result row. A job that did not
succeed (lost), a second result row for a job (duplicate), a success without its result row or a
result row without its success is a failure (exit 1). Handlers that ran more than once are
reported, not failed: the jobs the killed worker had started run again elsewhere, and that is
the promise (at-least-once execution).

Every connection of the run, the workers' included, gets ``-c search_path=<schema>`` as a
startup option, so the unchanged worker command and the unchanged migrations work inside the
schema; verify checks that the option took effect before it installs anything there. Not
promised: running through a pooler that drops startup options (PgBouncer in transaction mode
without ``search_path`` among its tracked parameters). verify then stops with status 2 and
says so; point it at a session-mode pool or at the server. Nor does it leave the rest of the
database entirely untouched: ``pg_notify`` reaches every listener of the database, so your own
workers see (and ignore) wake-ups for the queue ``sa_jobqueue_verify``. A verify process that
is itself SIGKILLed cannot drop its schema (its workers do stop, within a second or two).
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy import Engine, func, select
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from ..database import POOLER_ENV, Pooler, create_engine, normalise_url, ping, url_options
from ..errors import JobQueueError
from ..models import FINISHED_STATUSES, RUNNING, SUCCEEDED, jobs_table, workers_table
from ..queue import JobQueue
from ..tasks import JobContext
from .verify_report import Report, RunEvents, Settings, measure, metadata

#: The run's schema is this prefix and 12 random hex digits; nothing else is ever created.
SCHEMA_PREFIX: Final = "sa_jobqueue_verify_"
#: What the worker processes read: the schema of the run, and the pid of the verify process
#: (a worker whose parent is gone stops itself).
SCHEMA_ENV: Final = "SA_JOBQUEUE_VERIFY_SCHEMA"
PARENT_ENV: Final = "SA_JOBQUEUE_VERIFY_PARENT"
#: The queue and the task of the run. A queue name of its own: even a worker connection that
#: somehow missed the schema would claim only jobs of this queue, never yours.
QUEUE: Final = "sa_jobqueue_verify"
TASK: Final = "verify_job"
WORKER_APP: Final = "sa_jobqueue.ops.verify_tasks:queue"
#: Jobs per enqueue transaction.
ENQUEUE_BATCH: Final = 1_000
#: The kill comes once this share of the jobs has succeeded.
KILL_AT: Final = 1 / 3
#: How long the workers may take to start (import, connect, check the schema), in seconds.
WORKER_START_TIMEOUT: Final = 60.0
#: Seconds a worker gets to finish its running jobs after the run's SIGTERM, and how much
#: longer verify waits for it before SIGKILL.
SHUTDOWN_GRACE: Final = 10.0
#: How often progress is read while the workers drain the jobs (seconds).
POLL: Final = 0.05

EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_INTERRUPTED: Final = 130

log = logging.getLogger("sa_jobqueue.verify")
j = jobs_table.c
w = workers_table.c

#: This process only enqueues; the handler that runs lives in sa_jobqueue.ops.verify_tasks, which
#: only the workers import.
_enqueuer = JobQueue(default_queue=QUEUE)


@_enqueuer.task(name=TASK)
def _enqueue_only(ctx: JobContext, payload: Any) -> None:
    raise RuntimeError("verify jobs run in the workers that `sa-jobqueue verify` starts")


class SetupError(JobQueueError):
    """verify could not set up or run its test (exit status 2): nothing was verified."""


def schema_options(schema: str) -> str:
    """The startup option that puts ``schema`` first (and alone) on a connection's search_path.

    The name is checked against the pattern verify generates, so it never needs quoting.
    """
    if not (
        schema.startswith(SCHEMA_PREFIX)
        and len(schema) == len(SCHEMA_PREFIX) + 12
        and all(c in "0123456789abcdef" for c in schema.removeprefix(SCHEMA_PREFIX))
    ):
        raise ValueError(f"not a verify schema name: {schema!r}")
    return f"-c search_path={schema}"


def join_options(*parts: str | None) -> str:
    """libpq ``options`` strings joined, e.g. a URL's own with ours."""
    return " ".join(p for p in parts if p)


# -- the command line ------------------------------------------------------------------------


def _number(kind: type[int] | type[float], low: float, high: float) -> Callable[[str], Any]:
    def parse(value: str) -> Any:
        try:
            number = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
        if not low <= number <= high:
            raise argparse.ArgumentTypeError(f"must be from {low:g} to {high:g}")
        return number

    return parse


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    database_option: Callable[[argparse.ArgumentParser], None],
) -> None:
    """Declare ``sa-jobqueue verify`` and its options."""
    d = Settings()
    sub = commands.add_parser(
        "verify",
        help="prove the queue's promise on your database: N jobs, W workers, one of them killed",
        description="Run N jobs across W worker processes in a temporary schema of your"
        " database, SIGKILL one worker mid-run, and report duplicates, losses, throughput and"
        " latency. Exit 0: nothing lost or doubled; 1: something was; 2: could not run.",
    )
    database_option(sub)
    sub.add_argument(
        "--jobs",
        type=_number(int, 1, 10_000_000),
        default=d.jobs,
        metavar="N",
        help=f"jobs to run (default {d.jobs:,})",
    )
    sub.add_argument(
        "--workers",
        type=_number(int, 1, 64),
        default=d.workers,
        metavar="W",
        help=f"worker processes (default {d.workers})",
    )
    sub.add_argument(
        "--concurrency",
        type=_number(int, 1, 256),
        default=d.concurrency,
        metavar="N",
        help=f"handler threads per worker (default {d.concurrency})",
    )
    sub.add_argument(
        "--work-ms",
        type=_number(float, 0, 60_000),
        default=2.0,
        metavar="MS",
        help="milliseconds each handler sleeps, its 'work' (default 2)",
    )
    sub.add_argument(
        "--lease",
        type=_number(float, 1, 3600),
        default=3.0,
        metavar="SECONDS",
        help="the jobs' lease: how long the killed worker's jobs wait to be reclaimed (default 3)",
    )
    sub.add_argument(
        "--timeout",
        type=_number(float, 1, 86_400),
        default=300.0,
        metavar="SECONDS",
        help="give up waiting for the jobs after this long; unfinished ones count as lost"
        " (default 300)",
    )
    sub.add_argument(
        "--no-listen",
        dest="listen",
        action="store_false",
        help="workers poll only, no LISTEN (as behind PgBouncer in transaction mode)",
    )
    sub.add_argument("--json", action="store_true", help="the report as JSON")
    sub.add_argument(
        "--keep",
        action="store_true",
        help="keep the schema (and the workers' logs) for a look afterwards",
    )


def run(args: argparse.Namespace) -> int:
    """``sa-jobqueue verify``: 0 when nothing was lost or doubled, 1 otherwise, 2 on errors."""
    settings = Settings(
        jobs=args.jobs,
        workers=args.workers,
        concurrency=args.concurrency,
        work=timedelta(milliseconds=args.work_ms),
        lease=timedelta(seconds=args.lease),
        timeout=timedelta(seconds=args.timeout),
        listen=args.listen,
        keep=args.keep,
        pooler=args.pooler,
    )

    def say(message: str) -> None:
        if not args.json:
            print(f"sa-jobqueue verify: {message}", file=sys.stderr, flush=True)

    if log.getEffectiveLevel() > logging.DEBUG:
        logging.getLogger("alembic").setLevel(logging.WARNING)  # no line per revision
    # SIGTERM (a cancelled CI job, `kill`) cleans up as Ctrl-C does.
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler) if main_thread else None
    try:
        report = verify(args.database_url, settings, say)
    except KeyboardInterrupt:
        print("sa-jobqueue: verify interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (JobQueueError, DBAPIError) as exc:
        print(f"sa-jobqueue: {_reason(exc)}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    print(report.as_json() if args.json else report.as_text())
    return 0 if report.ok else EXIT_FAILED


def _reason(exc: BaseException) -> str:
    if isinstance(exc, DBAPIError):
        text = str(exc.orig) if exc.orig is not None else str(exc)
        return text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return str(exc)


# -- the run ---------------------------------------------------------------------------------


def verify(
    url: str | URL, settings: Settings, say: Callable[[str], None] = lambda _: None
) -> Report:
    """Run the hammer test in a fresh schema of ``url``'s database and report what it found.

    Raises SetupError (or DatabaseUnavailableError) when the test could not run. The schema
    is dropped before it returns or raises, unless ``settings.keep``.
    """
    started = time.monotonic()
    url = normalise_url(url)
    schema = SCHEMA_PREFIX + secrets.token_hex(6)
    admin = create_engine(
        url,
        pooler=settings.pooler,
        settings={"lock_timeout": "10s"},
        poolclass=NullPool,
        isolation_level="AUTOCOMMIT",
        connect_args={"application_name": "sa-jobqueue verify"},
    )
    ping(admin)
    try:
        with admin.connect() as conn:
            conn.execute(sa.schema.CreateSchema(schema))
    except DBAPIError as exc:
        raise SetupError(f"cannot create schema {schema}: {_reason(exc)}") from exc
    logs = Path(tempfile.mkdtemp(prefix="sa_jobqueue_verify_"))
    url = _schema_url(url, schema)
    engine = _schema_engine(url, settings.pooler)
    workers = _Workers(url, schema, settings, logs)
    dropped = False
    report: Report | None = None
    try:
        with _setup_errors(schema):
            _install(engine, schema)
        say(f"schema {schema} ready; starting {settings.workers} workers")
        run = _Run(engine, workers, settings, say)
        run.start_workers()
        run.enqueue()
        run.drain()
        workers.stop()
        with engine.connect() as conn:
            report = measure(conn, settings, schema, run.events)
    finally:
        workers.stop()
        engine.dispose()
        if not settings.keep:
            dropped = _drop(admin, schema)
            shutil.rmtree(logs, ignore_errors=True)
            if dropped and report is None:  # on the way out with an error
                say(f"stopped the workers and dropped schema {schema}")
        else:
            say(f"kept schema {schema}; worker logs in {logs}")
        admin.dispose()
    report.schema_dropped = dropped
    report.unexpected_exits = workers.unexpected
    report.wall_seconds = round(time.monotonic() - started, 3)
    return report


def _schema_url(url: URL, schema: str) -> URL:
    """``url`` with ``schema`` alone on its search_path, in its ``options``.

    Every engine keeps a URL's options, as startup options or, behind a transaction pooler,
    as settings applied in every transaction (see :func:`sa_jobqueue.database.create_engine`),
    so every connection of the run lands in the schema, the workers' included.
    """
    options = join_options(url_options(url), schema_options(schema))
    return url.update_query_dict({"options": options})


def _schema_engine(url: URL, pooler: Pooler = "session") -> Engine:
    """An engine on a URL made by :func:`_schema_url`."""
    return create_engine(
        url,
        pooler=pooler,
        pool_size=2,
        max_overflow=2,
        connect_args={"application_name": "sa-jobqueue verify"},
    )


@contextmanager
def _setup_errors(schema: str) -> Iterator[None]:
    try:
        yield
    except DBAPIError as exc:
        raise SetupError(f"cannot set up schema {schema}: {_reason(exc)}") from exc


def _install(engine: Engine, schema: str) -> None:
    """Check that connections land in ``schema``, then migrate it and add the record tables."""
    from ..migrations import upgrade

    with engine.connect() as conn:
        landed = conn.execute(select(func.current_schema())).scalar()
    if landed != schema:
        raise SetupError(
            f"connections ignore the search_path option (they land in {landed!r}): behind"
            " PgBouncer in transaction mode, run verify with --pooler transaction"
        )
    upgrade(engine)
    metadata.create_all(engine)


def _drop(admin: Engine, schema: str) -> bool:
    try:
        with admin.connect() as conn:
            conn.execute(sa.schema.DropSchema(schema, cascade=True))
    except DBAPIError as exc:
        print(
            f"sa-jobqueue: could not drop schema {schema} ({_reason(exc)}):"
            f" DROP SCHEMA {schema} CASCADE removes it",
            file=sys.stderr,
        )
        return False
    return True


class _Workers:
    """The worker subprocesses: the real ``sa-jobqueue worker`` command, each with a log file."""

    def __init__(self, url: URL, schema: str, settings: Settings, logs: Path) -> None:
        self.settings = settings
        self.logs = logs
        self.procs: list[subprocess.Popen[bytes]] = []
        self.killed: set[int] = set()
        self.told: set[int] = set()  # SIGTERMed by stop(): they exit, as told
        self.unexpected: list[str] = []
        self._reported: set[int] = set()
        # The URL goes in the environment, not on the command line, where `ps` shows it.
        self.env = {
            **os.environ,
            "DATABASE_URL": url.render_as_string(hide_password=False),
            SCHEMA_ENV: schema,
            PARENT_ENV: str(os.getpid()),
            POOLER_ENV: settings.pooler,
        }

    def start(self) -> subprocess.Popen[bytes]:
        command = [
            sys.executable,
            "-m",
            "sa_jobqueue",
            "--log-level",
            "WARNING",
            "worker",
            WORKER_APP,
            "--concurrency",
            str(self.settings.concurrency),
            "--queues",
            QUEUE,
            # Never prune: the finished rows are the evidence, and the prune lock is an
            # advisory lock shared with your own workers.
            "--retention",
            "forever",
            "--shutdown-grace",
            str(SHUTDOWN_GRACE),
        ]
        if not self.settings.listen:
            command.append("--no-listen")
        with (self.logs / f"worker-{len(self.procs)}.log").open("wb") as out:
            proc = subprocess.Popen(
                command,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                # A Ctrl-C at the terminal reaches verify alone, which then stops the workers
                # and drops the schema in order.
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    @property
    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        self.killed.add(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def check_exits(self) -> None:
        """Note workers that exited without being told to (with the last line of their log)."""
        for i, proc in enumerate(self.procs):
            code = proc.poll()
            if code is None or proc.pid in self.killed | self.told | self._reported:
                continue
            self._reported.add(proc.pid)
            lines = (self.logs / f"worker-{i}.log").read_text(errors="replace").splitlines()
            last = lines[-1].strip() if lines else "(no output)"
            self.unexpected.append(f"worker {proc.pid} exited with status {code}: {last}")

    def stop(self) -> None:
        """SIGTERM the workers still running; SIGKILL those that outlast their grace."""
        alive = self.alive
        for proc in alive:
            self.told.add(proc.pid)
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + SHUTDOWN_GRACE + 5
        for proc in alive:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self.check_exits()


class _Run:
    """The moving parts of one run: start, enqueue, drain with a kill, and what happened."""

    def __init__(
        self, engine: Engine, workers: _Workers, settings: Settings, say: Callable[[str], None]
    ) -> None:
        self.engine = engine
        self.workers = workers
        self.settings = settings
        self.say = say
        self.events = RunEvents()

    def start_workers(self) -> None:
        """Start the workers and wait until each has registered (started up, schema checked),
        so that start-up time does not count as latency."""
        pids = {self.workers.start().pid for _ in range(self.settings.workers)}
        deadline = time.monotonic() + WORKER_START_TIMEOUT
        while True:
            with self.engine.connect() as conn:
                seen = set(conn.execute(select(w.pid)).scalars())
            if pids <= seen:
                return
            self.workers.check_exits()
            if self.workers.unexpected:
                raise SetupError(self.workers.unexpected[0])
            if time.monotonic() > deadline:
                raise SetupError(f"workers did not start within {WORKER_START_TIMEOUT:g}s")
            time.sleep(0.1)

    def enqueue(self) -> None:
        """Enqueue the jobs, ``ENQUEUE_BATCH`` per transaction; the workers start at once."""
        payload = {"ms": self.settings.work.total_seconds() * 1000}
        self.say(f"enqueueing {self.settings.jobs:,} jobs")
        left = self.settings.jobs
        while left:
            n = min(left, ENQUEUE_BATCH)
            with Session(self.engine) as session, session.begin():
                _enqueuer.enqueue_many(session, TASK, [payload] * n, lease=self.settings.lease)
            left -= n

    def drain(self) -> None:
        """Wait for every job to finish, killing one worker a third of the way through."""
        deadline = time.monotonic() + self.settings.timeout.total_seconds()
        kill_at = max(1, int(self.settings.jobs * KILL_AT))
        progress = select(
            func.count().filter(j.status == SUCCEEDED),
            func.count().filter(j.status.in_(FINISHED_STATUSES)),
        )
        while True:
            with self.engine.connect() as conn:
                succeeded, finished = conn.execute(progress).one()
            if self.events.killed_worker is None and succeeded >= kill_at:
                self._kill_one(succeeded)
            if finished >= self.settings.jobs:
                return
            self.workers.check_exits()
            if time.monotonic() > deadline:
                self.events.timed_out = True
                return
            if not self.workers.alive:
                return  # nobody left to run the rest: they count as lost
            time.sleep(POLL)

    def _kill_one(self, succeeded: int) -> None:
        """SIGKILL the worker holding the most running jobs; start another in its place."""
        ours = {p.pid: p for p in self.workers.alive}
        with self.engine.connect() as conn:
            holding = conn.execute(
                select(w.pid, func.count())
                .select_from(jobs_table.join(workers_table, w.name == j.worker))
                .where(j.status == RUNNING)
                .group_by(w.pid)
            ).all()
        counts = {pid: n for pid, n in holding if pid in ours}
        victim = max(counts, key=counts.__getitem__) if counts else next(iter(ours), None)
        if victim is None:
            return
        self.workers.kill(ours[victim])
        with self.engine.connect() as conn:
            self.events.killed_at = conn.execute(select(func.clock_timestamp())).scalar_one()
        lease = self.settings.lease.total_seconds()
        self.events.killed_worker = victim
        self.events.killed_worker_claimed_jobs = claimed = counts.get(victim, 0)
        self.events.killed_after_succeeded = succeeded
        self.events.replacement_worker = replacement = self.workers.start().pid
        self.say(
            f"killed worker {victim} (SIGKILL) with {claimed} job(s) claimed; started worker"
            f" {replacement}; the killed worker's jobs wait out their {lease:g}s lease"
        )
