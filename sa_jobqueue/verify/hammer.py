"""One verify run: set up its schema, start the workers, enqueue, kill one, count, clean up."""

from __future__ import annotations

import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from sqlalchemy import Engine
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from .._sql import session as session_sql
from .._sql import verify as verify_sql
from ..database import Pooler, create_engine, normalise_url, ping, url_options
from ..errors import JobQueueError
from ..queue import JobQueue
from ..tasks import JobContext
from .names import (
    QUEUE,
    SCHEMA_ENV,
    SCHEMA_PREFIX,
    TASK,
    WORKER_APP,
    join_options,
    schema_options,
)
from .report import Report, RunEvents, Settings, measure
from .workers import WorkerProcesses

__all__ = ["SCHEMA_ENV", "SCHEMA_PREFIX", "TASK", "WORKER_APP", "SetupError", "verify"]

#: Jobs per enqueue transaction.
ENQUEUE_BATCH: Final = 1_000
#: The kill comes once this share of the jobs has succeeded.
KILL_AT: Final = 1 / 3
#: How long the workers may take to start (import, connect, check the schema), in seconds.
WORKER_START_TIMEOUT: Final = 60.0
#: How often progress is read while the workers drain the jobs (seconds).
POLL: Final = 0.05

#: This process only enqueues; the handler that runs lives in sa_jobqueue.verify.tasks, which
#: only the workers import.
_enqueuer = JobQueue(default_queue=QUEUE)


@_enqueuer.task(name=TASK)
def _enqueue_only(ctx: JobContext, payload: Any) -> None:
    raise RuntimeError("verify jobs run in the workers that `sa-jobqueue verify` starts")


class SetupError(JobQueueError):
    """verify could not set up or run its test (exit status 2): nothing was verified."""


def reason(exc: BaseException) -> str:
    """The first line of what went wrong, for a message."""
    if isinstance(exc, DBAPIError):
        text = str(exc.orig) if exc.orig is not None else str(exc)
        return text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return str(exc)


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
            conn.execute(verify_sql.create_schema(schema))
    except DBAPIError as exc:
        raise SetupError(f"cannot create schema {schema}: {reason(exc)}") from exc
    logs = Path(tempfile.mkdtemp(prefix="sa_jobqueue_verify_"))
    url = _schema_url(url, schema)
    engine = _schema_engine(url, settings.pooler)
    workers = WorkerProcesses(url, schema, settings, logs)
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
        raise SetupError(f"cannot set up schema {schema}: {reason(exc)}") from exc


def _install(engine: Engine, schema: str) -> None:
    """Check that connections land in ``schema``, then migrate it and add the record tables."""
    from ..migrations import upgrade

    with engine.connect() as conn:
        landed = conn.execute(session_sql.current_schema()).scalar()
    if landed != schema:
        raise SetupError(
            f"connections ignore the search_path option (they land in {landed!r}): behind"
            " PgBouncer in transaction mode, run verify with --pooler transaction"
        )
    upgrade(engine)
    verify_sql.metadata.create_all(engine)


def _drop(admin: Engine, schema: str) -> bool:
    try:
        with admin.connect() as conn:
            conn.execute(verify_sql.drop_schema(schema))
    except DBAPIError as exc:
        print(
            f"sa-jobqueue: could not drop schema {schema} ({reason(exc)}):"
            f" DROP SCHEMA {schema} CASCADE removes it",
            file=sys.stderr,
        )
        return False
    return True


class _Run:
    """The moving parts of one run: start, enqueue, drain with a kill, and what happened."""

    def __init__(
        self,
        engine: Engine,
        workers: WorkerProcesses,
        settings: Settings,
        say: Callable[[str], None],
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
                seen = set(conn.execute(verify_sql.registered_pids()).scalars())
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
        progress = verify_sql.progress()
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
            holding = conn.execute(verify_sql.running_per_worker_pid()).all()
        counts = {pid: n for pid, n in holding if pid in ours}
        victim = max(counts, key=counts.__getitem__) if counts else next(iter(ours), None)
        if victim is None:
            return
        self.workers.kill(ours[victim])
        with self.engine.connect() as conn:
            self.events.killed_at = conn.execute(verify_sql.wall_clock()).scalar_one()
        lease = self.settings.lease.total_seconds()
        self.events.killed_worker = victim
        self.events.killed_worker_claimed_jobs = claimed = counts.get(victim, 0)
        self.events.killed_after_succeeded = succeeded
        self.events.replacement_worker = replacement = self.workers.start().pid
        self.say(
            f"killed worker {victim} (SIGKILL) with {claimed} job(s) claimed; started worker"
            f" {replacement}; the killed worker's jobs wait out their {lease:g}s lease"
        )
