"""A tour of sa_jobqueue against a real PostgreSQL server, in well under a minute.

    python examples/demo.py                                       # embedded PostgreSQL (pgserver)
    python examples/demo.py --database-url postgresql://user@host/app   # a database of yours

1. Outbox: an order and the job that confirms it are written in one transaction; a
   transaction that rolls back leaves neither.
2. Throughput: 5,000 jobs drained by one worker running 8 handler threads. Each handler
   writes one row through ``ctx.session``, which commits together with the job's completion.
3. Retries: a task that always fails is retried with exponential backoff, then dead-lettered
   with its error kept.
4. Summary: jobs by status, throughput, effect rows against jobs, the dead job's error.

It never touches data it did not create. It runs on the embedded server (``pgserver``, data in
``.demo-pgdata/``) unless ``--database-url`` names a database; ``$DATABASE_URL`` is never read,
since it usually points at the application's own database. Either way it works in a schema of
its own, ``sajq_demo_<12 hex digits>``, created for the run (CREATE SCHEMA fails rather than
reuse an existing one): every connection gets ``-c search_path=<that schema>``, so sa_jobqueue's
migrations, its table, the demo's tables and the worker all live there, and the schema is
dropped at the end, also after an error or Ctrl-C. A schema rather than a database of its own,
because creating a schema needs only the CREATE privilege on the database, which an
application's role usually has, where CREATE DATABASE needs CREATEDB, which it usually lacks.

Not promised: ``pg_notify`` reaches every listener of the database, so workers of yours on it
see (and ignore) the demo's wake-ups; a pooler that drops startup options (PgBouncer in
transaction mode) cannot carry the search_path, and the demo then stops before creating
anything but its (empty) schema; a demo process that is SIGKILLed leaves its schema behind
(``DROP SCHEMA sajq_demo_... CASCADE`` removes it).
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, TypeVar

from _database import database_url
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from sqlalchemy import BigInteger, Engine, func, select
from sqlalchemy.engine import URL
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from sqlalchemy.pool import NullPool
from sqlalchemy.schema import CreateSchema, DropSchema

from sa_jobqueue import Backoff, JobContext, JobInfo, JobQueue, Worker
from sa_jobqueue.database import create_engine, describe, normalise_url
from sa_jobqueue.migrations import upgrade
from sa_jobqueue.models import Job

N_JOBS = 5_000
CONCURRENCY = 8
#: The run's schema is this prefix and 12 random hex digits: a name no one else has chosen.
SCHEMA_PREFIX = "sajq_demo_"

console = Console()
queue = JobQueue()


# -- the application's own tables ------------------------------------------------------------


class DemoBase(DeclarativeBase):
    """The demo's tables, on a metadata of their own (sa_jobqueue's table is not in it)."""


class Order(DemoBase):
    __tablename__ = "demo_orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str]
    total_cents: Mapped[int]
    status: Mapped[str] = mapped_column(default="new")


class Effect(DemoBase):
    """One row per committed run of ``record_effect``: counts how often each job took effect."""

    __tablename__ = "demo_effects"

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(BigInteger, index=True)
    n: Mapped[int]


# -- tasks -----------------------------------------------------------------------------------


class PaymentDeclined(Exception):
    """Raised by the demo to abort a checkout transaction."""


class ProviderDown(Exception):
    """What the always-failing task raises."""


@queue.task
def confirm_order(ctx: JobContext, payload: dict[str, int]) -> None:
    order = ctx.session.get_one(Order, payload["order_id"])
    order.status = "confirmed"


@queue.task
def record_effect(ctx: JobContext, payload: dict[str, int]) -> None:
    ctx.session.add(Effect(job_id=ctx.job_id, n=payload["n"]))


@queue.task(
    queue="flaky",
    max_attempts=3,
    # Exact exponential schedule for the demo: 200 ms, then 400 ms (jitter=0 turns off the
    # randomisation that normally keeps jobs that failed together from retrying together).
    backoff=Backoff(base=timedelta(milliseconds=200), cap=timedelta(seconds=5), jitter=0),
)
def call_provider(ctx: JobContext, payload: dict[str, str]) -> None:
    raise ProviderDown(f"{payload['provider']} answered 503 (attempt {ctx.attempt})")


# -- helpers ---------------------------------------------------------------------------------

T = TypeVar("T")


def watch(read: Callable[[], T], *, timeout: float, interval: float = 0.05) -> Iterator[T]:
    """Yield ``read()`` every ``interval`` seconds until the caller breaks off.

    Raises TimeoutError once ``timeout`` seconds have passed: a demo that waits on a state
    polls for it with a deadline instead of sleeping for a guessed time.
    """
    deadline = time.monotonic() + timeout
    while True:
        yield read()
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting after {timeout}s")
        time.sleep(interval)


class BackgroundWorker:
    """Runs ``worker.run()`` in a thread; leaving the ``with`` block stops and joins it."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="demo-worker")

    def _run(self) -> None:
        try:
            self.worker.run()
        except BaseException as exc:
            self.error = exc

    def check(self) -> None:
        """Raise if the worker died (e.g. the schema is missing) instead of waiting in vain."""
        if not self.thread.is_alive():
            raise RuntimeError("the worker stopped unexpectedly") from self.error

    def __enter__(self) -> BackgroundWorker:
        self.thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.worker.stop()
        self.thread.join(timeout=self.worker.shutdown_grace.total_seconds() + 5)


def scalar(engine: Engine, statement: Any) -> Any:
    with engine.connect() as conn:
        return conn.execute(statement).scalar_one()


def count_jobs(engine: Engine, task: str, status: str | None = None) -> int:
    statement = select(func.count()).select_from(Job).where(Job.task == task)
    if status is not None:
        statement = statement.where(Job.status == status)
    return int(scalar(engine, statement))


def count_rows(engine: Engine, model: type[DemoBase]) -> int:
    return int(scalar(engine, select(func.count()).select_from(model)))


def clock(moment: datetime) -> str:
    """A database timestamp as time of day with milliseconds (in the database's time zone)."""
    return moment.strftime("%H:%M:%S.%f")[:-3]


# -- the four parts --------------------------------------------------------------------------


@contextmanager
def demo_database(given: str | None) -> Iterator[str]:
    """Yield the URL to work in: ``given``, else a database on the embedded server."""
    if given is not None:
        yield given
        return
    # examples/_database.py prefers $DATABASE_URL to the embedded server; the demo never takes
    # it (it usually points at the application's database), so hide it from this process.
    os.environ.pop("DATABASE_URL", None)
    with database_url("sajq_demo") as url:
        yield url


@contextmanager
def own_schema(url: str) -> Iterator[tuple[URL, str]]:
    """Create a fresh schema in ``url``'s database; yield a URL that lands in it; drop it.

    The URL carries the schema as a startup option (``-c search_path=...``), so every
    connection made from it (the engine's pool, and the worker's own listener and control
    connections, which are made from the engine's URL) works there and nowhere else.
    """
    base = normalise_url(url)
    schema = SCHEMA_PREFIX + secrets.token_hex(6)  # lowercase letters and digits: no quoting
    given = base.query.get("options")
    options = " ".join(given) if isinstance(given, tuple) else given
    inside = base.update_query_dict(
        {"options": f"{options} -c search_path={schema}" if options else f"-c search_path={schema}"}
    )
    admin = create_engine(base, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(CreateSchema(schema))  # fails, rather than reuse, if the name is taken
        try:
            yield inside, schema
        finally:
            with admin.connect() as conn:
                conn.execute(DropSchema(schema, cascade=True))
            console.print(f"dropped schema {schema} and everything the demo made in it")
    finally:
        admin.dispose()


def install(engine: Engine, schema: str) -> None:
    """Check that connections land in the demo's schema, then install both sets of tables."""
    landed = scalar(engine, select(func.current_schema()))
    if landed != schema:
        # Installing now would put the tables wherever the connection landed: the user's.
        raise SystemExit(
            f"connections ignore the search_path startup option (they land in {landed!r}); a"
            " pooler such as PgBouncer in transaction mode drops it: use the server directly"
        )
    upgrade(engine)  # the same as `sa-jobqueue migrate`, here inside the demo's schema
    DemoBase.metadata.create_all(engine)


def outbox(engine: Engine) -> int:
    """Part 1: a business row and its job in one transaction. Returns the order's id."""
    console.rule("[bold]1. Outbox: the job exists if and only if the order does")
    counts = Table("after", "demo_orders rows", "confirm_order jobs")

    with Session(engine) as session, session.begin():
        order = Order(customer="Ada", total_cents=4_200)
        session.add(order)
        session.flush()  # assigns order.id
        order_id = order.id
        job_id = queue.enqueue(session, confirm_order, {"order_id": order_id})
    console.print(f"committed: order #{order_id} and job #{job_id}, one transaction")
    counts.add_row(
        "commit",
        str(count_rows(engine, Order)),
        str(count_jobs(engine, confirm_order.name)),
    )

    try:
        with Session(engine) as session, session.begin():
            order = Order(customer="Bob", total_cents=999)
            session.add(order)
            session.flush()
            queue.enqueue(session, confirm_order, {"order_id": order.id})
            raise PaymentDeclined("card declined")
    except PaymentDeclined as exc:
        console.print(f"rolled back: a second order and its job ({exc!r})")
    counts.add_row(
        "rollback",
        str(count_rows(engine, Order)),
        str(count_jobs(engine, confirm_order.name)),
    )
    console.print(counts)
    return order_id


@dataclass(frozen=True)
class Throughput:
    jobs: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else float("nan")


def drain(engine: Engine) -> Throughput:
    """Part 2: enqueue N_JOBS in one statement, drain them with one worker, watch progress."""
    console.rule(f"[bold]2. {N_JOBS:,} jobs, one worker, {CONCURRENCY} handler threads")
    started = time.perf_counter()
    with Session(engine) as session, session.begin():
        queue.enqueue_many(session, record_effect, ({"n": n} for n in range(N_JOBS)))
    console.print(
        f"enqueued {N_JOBS:,} jobs with one enqueue_many() in {time.perf_counter() - started:.2f}s"
    )

    worker = Worker(
        queue,
        engine,
        concurrency=CONCURRENCY,
        queues=["default"],
        # No pruning: its advisory lock is shared by every worker on the database, yours too.
        retention=None,
    )
    progress = Progress(
        TextColumn("[bold]record_effect"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )
    with progress, BackgroundWorker(worker) as background:
        bar = progress.add_task("succeeded", total=N_JOBS)
        # The bar follows the database, not the worker: it counts succeeded rows.
        for done in watch(
            lambda: count_jobs(engine, record_effect.name, "succeeded"), timeout=60, interval=0.1
        ):
            background.check()
            progress.update(bar, completed=done)
            if done >= N_JOBS:
                break

    # Throughput by the database clock: first claim to last completion.
    with engine.connect() as conn:
        jobs, first, last = conn.execute(
            select(func.count(), func.min(Job.started_at), func.max(Job.finished_at)).where(
                Job.task == record_effect.name, Job.status == "succeeded"
            )
        ).one()
    assert first is not None
    assert last is not None
    result = Throughput(jobs, (last - first).total_seconds())
    console.print(f"{result.jobs:,} jobs in {result.seconds:.2f}s: {result.per_second:,.0f} jobs/s")
    return result


def retries(engine: Engine) -> JobInfo:
    """Part 3: a failing task retried with backoff, then dead. Returns the dead job."""
    console.rule("[bold]3. Retries with backoff, then the dead letter")
    with Session(engine) as session, session.begin():
        job_id = queue.enqueue(session, call_provider, {"provider": "acme-payments"})
    console.print(
        f"job #{job_id}: call_provider, max_attempts=3, backoff 200 ms doubling, no jitter"
    )

    def read() -> JobInfo:
        with engine.connect() as conn:
            job = queue.get_job(conn, job_id)
        assert job is not None
        return job

    # A retry is not announced by NOTIFY: an idle worker finds it on its next poll, so a short
    # poll interval makes each attempt start close to its visible_at.
    worker = Worker(
        queue,
        engine,
        concurrency=1,
        queues=["flaky"],
        poll_interval=timedelta(milliseconds=50),
        retention=None,
    )
    seen: tuple[str, int] | None = None
    with BackgroundWorker(worker) as background:
        for job in watch(read, timeout=30, interval=0.01):
            background.check()
            if (job.status, job.attempts) != seen:
                seen = (job.status, job.attempts)
                report(job)
            if job.status == "dead":
                break
    return job


def report(job: JobInfo) -> None:
    """Print one observed state of the failing job, as read from the database."""
    if job.status == "queued" and job.attempts == 0:
        console.print(f"  enqueued, visible at {clock(job.visible_at)}")
        return
    assert job.started_at is not None
    line = f"  attempt {job.attempts}  claimed {clock(job.started_at)}"
    if job.status == "running":
        console.print(f"{line}  running")
    elif job.status == "queued":
        backoff = (job.visible_at - job.started_at).total_seconds()
        console.print(f"{line}  failed, next at {clock(job.visible_at)} (+{backoff:.3f}s)")
    elif job.status == "dead":
        console.print(f"{line}  failed, [bold red]dead[/] (no attempts left)")


def summary(
    engine: Engine, order_id: int, throughput: Throughput, dead: JobInfo, seconds: float
) -> None:
    """Part 4: one table of what the database now says."""
    console.rule("[bold]4. Summary")
    with Session(engine) as session:
        by_queue = queue.counts(session)
        order = session.get_one(Order, order_id)
        effects = count_rows(engine, Effect)
        distinct = scalar(engine, select(func.count(func.distinct(Effect.job_id))))

    table = Table("measure", "value", title="sa_jobqueue demo", title_style="bold")
    for queue_name, statuses in by_queue.items():
        for status, n in statuses.items():
            table.add_row(f"jobs in {queue_name!r}: {status}", f"{n:,}")
    table.add_section()
    table.add_row("throughput (DB clock)", f"{throughput.per_second:,.0f} jobs/s")
    ok = effects == distinct == throughput.jobs
    table.add_row(
        "effect rows / jobs",
        f"{effects:,} rows for {throughput.jobs:,} jobs " + ("[green]✓[/]" if ok else "[red]✗[/]"),
    )
    table.add_row(f"order #{order_id}", order.status)
    error = dead.last_error or {}
    table.add_row(f"dead job #{dead.id}", escape(f"{error.get('type')}: {error.get('message')}"))
    table.add_section()
    table.add_row("demo wall time", f"{seconds:.1f}s")
    console.print(table)
    console.print(
        Panel(
            escape(str(error.get("traceback", "")).strip()),
            title=f"last_error.traceback of job #{dead.id} (kept in the row)",
            border_style="red",
        )
    )
    if not ok:
        raise SystemExit("effect rows do not match the jobs")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="A tour of sa_jobqueue: outbox, throughput, retries, summary.",
        epilog="$DATABASE_URL is never used: without --database-url the demo runs on an"
        " embedded PostgreSQL server.",
    )
    parser.add_argument(
        "--database-url",
        metavar="URL",
        help="run in a new schema of this database, dropped at the end; nothing else in the"
        " database is touched (default: the embedded server, data in .demo-pgdata/)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING,
        format="%(message)s",
        handlers=[RichHandler(console=console, show_path=False)],
    )
    started = time.perf_counter()
    with demo_database(args.database_url) as url, own_schema(url) as (inside, schema):
        engine = create_engine(inside, pool_size=CONCURRENCY + 4, max_overflow=4)
        try:
            version = scalar(engine, select(func.current_setting("server_version")))
            where = (
                "the embedded PostgreSQL (pgserver)"
                if args.database_url is None
                else describe(engine.url.difference_update_query(["options"]))
            )
            console.print(
                Panel(
                    f"PostgreSQL {version} at {where}\n"
                    f"working in schema {schema}, dropped at the end",
                    title="sa_jobqueue demo",
                    border_style="blue",
                )
            )
            install(engine, schema)
            order_id = outbox(engine)
            throughput = drain(engine)
            dead = retries(engine)
            summary(engine, order_id, throughput, dead, time.perf_counter() - started)
        finally:
            engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
