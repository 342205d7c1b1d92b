"""What one seed runs against: its database, its worker processes, and the network between.

The workers reach the database directly, through a :class:`FaultProxy` (which can black-hole
the connections open now, or refuse new ones for a while), or through a real PgBouncer in
transaction mode (which can be restarted on its port). The checker's own connections and the
handlers' audit always go straight to the server: the faults are aimed at the workers alone.
Every process and socket here belongs to the seed, and :meth:`Cluster.close` ends them all.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import URL

from sa_jobqueue.worker._lanes import PREFETCH_MAX_FACTOR
from tests.helpers.databases import admin_engine, url_string
from tests.helpers.poolers import PGBOUNCER, PgBouncer, SilentProxy
from tests.helpers.processes import CLI, REPO_ROOT, subprocess_env
from tests.model.tasks import AUDIT_URL

APP = "tests.model.tasks:queue"
#: The queues every worker serves. No task declares ``q3``, ``mc-1`` or ``mc-2``: their jobs
#: get there by ``enqueue(..., queue=...)``, and the workers serve queues none of their tasks
#: names.
QUEUES = ("default", "q1", "q2", "q3", "mc-1", "mc-2")
#: How a worker names the queues it serves (its ``--queues``): each by name, by patterns, or
#: every queue (``*``). Each is a lane of many queues: the unlimited ones are claimed in one
#: statement (``_sql/claim_many.py``: by ``:queues``, or ``LIKE ANY(:patterns)``), each paused
#: or limited one that the lane serves by its own limited claim.
SERVINGS = {
    "names": ",".join(QUEUES),
    "patterns": "default,q?,mc-*",
    "all": "*",
}
#: The patterns a burst may name besides QUEUES.
PATTERNS = ("q?", "mc-*")
#: A supervised worker's processes (``--processes``).
PROCESSES = 2
#: The application_name of the checker's own connections: never a fault's target.
CHECKER_APP = "mc_checker"


#: The proxy between the workers and the server: it can black-hole the connections open now,
#: refuse new ones for a while, and cut new ones at their first query.
FaultProxy = SilentProxy


def restart_bouncer(bouncer: PgBouncer) -> None:
    """Kill PgBouncer and start it again on the same port and settings (clients reconnect)."""
    bouncer.proc.kill()
    bouncer.proc.wait(10)
    assert PGBOUNCER is not None
    command = [PGBOUNCER, str(bouncer.dir / "pgbouncer.ini")]
    if bouncer._user is not None:
        command[1:1] = ["-u", bouncer._user]
    deadline = time.monotonic() + 10
    while True:  # the old process's port may take a moment to be free again
        bouncer.proc = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        with contextlib.suppress(subprocess.TimeoutExpired):
            bouncer.proc.wait(0.3)
        if bouncer.proc.poll() is None or time.monotonic() > deadline:
            return


def matching(entries: list[str]) -> list[str]:
    """The queues of QUEUES that ``entries`` (names and patterns, as ``--queues`` takes them)
    name."""
    return [q for q in QUEUES if any(fnmatch.fnmatchcase(q, e) for e in entries)]


@dataclass
class WorkerProc:
    """One worker subprocess and what the checker did to it.

    A supervised one (``--processes``) is the supervisor: its worker processes are its
    :meth:`children`, which it restarts when they die.
    """

    proc: subprocess.Popen[bytes]
    log: Path
    stopped: bool = False  # SIGSTOP sent, no SIGCONT yet
    leaving: bool = False  # SIGTERM or SIGKILL sent: it may exit
    term: bool = False  # SIGTERM sent (and no SIGKILL): it must exit 0
    serving: str = "names"  # a key of SERVINGS
    processes: int = 1  # more than 1: a supervisor of that many worker processes
    #: When the checker SIGKILLed one of a supervisor's children (monotonic).
    kills: list[float] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def supervised(self) -> bool:
        return self.processes > 1

    def children(self) -> list[int]:
        """A supervisor's worker processes now: its children started by ``spawn`` (not its
        resource tracker), from Linux's /proc; [] for a worker that is not supervised."""
        if not self.supervised or not self.alive():
            return []
        found = []
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{self.pid}/task").iterdir():
                with contextlib.suppress(OSError):
                    found += [int(p) for p in (task / "children").read_text().split()]
        workers = []
        for pid in sorted(set(found)):
            with contextlib.suppress(OSError):
                if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    workers.append(pid)
        return workers

    def worker_pids(self) -> list[int]:
        """The pids of its worker processes: its own, or a supervisor's children."""
        return self.children() if self.supervised else [self.pid]


@dataclass
class Cluster:
    """The seed's database URLs, its network and its workers."""

    database: URL  # direct, for the checker and the audit
    network: str  # "direct", "proxy" or "bouncer"
    logs: Path
    concurrency: int = 3
    prefetch: int | None = None
    #: Burst workers reach the database directly, not through the proxy or the pooler.
    bursts_direct: bool = False
    #: The login role of the workers (not the bursts), when not the server's user.
    role: str | None = None
    proxy: FaultProxy | None = None
    bouncer: PgBouncer | None = None
    workers: list[WorkerProc] = field(default_factory=list)
    #: Burst workers (``--burst``): not targets of faults, each watched by its own thread.
    bursts: list[WorkerProc] = field(default_factory=list)
    #: How the workers name their queues, in turn: the n-th worker started serves
    #: ``servings[n % len(servings)]`` (keys of SERVINGS).
    servings: tuple[str, ...] = ("names",)
    #: Whether the first worker is a supervisor of PROCESSES worker processes.
    supervised: bool = False

    @classmethod
    def open(
        cls, database: URL, network: str, logs: Path, concurrency: int, prefetch: int | None
    ) -> Cluster:
        cluster = cls(database, network, logs, concurrency, prefetch)
        if network == "proxy":
            cluster.proxy = FaultProxy(database)
        elif network == "bouncer":
            cluster.bouncer = PgBouncer(database, "transaction", pool_size=20)
        return cluster

    def worker_url(self) -> URL:
        database = self.database
        if self.role is not None:
            database = database.set(username=self.role, password=None)
        if self.proxy is not None:
            return self.proxy.url(database)
        if self.bouncer is not None:
            return self.bouncer.url(self.database)  # its auth file knows the server's user
        return database

    def start_worker(self, burst: list[str] | None = None) -> WorkerProc:
        """Start a worker of every queue, or with ``burst``, a burst worker of those queues.

        The n-th worker names its queues as ``servings`` says in turn; the first is a
        supervisor when ``supervised`` says so.
        """
        serving = self.servings[len(self.workers) % len(self.servings)]
        processes = PROCESSES if burst is None and self.supervised and not self.workers else 1
        if burst is None:
            log = self.logs / f"worker-{len(self.workers)}.log"
            queues = SERVINGS[serving]
        else:
            log = self.logs / f"burst-{len(self.bursts)}.log"
            queues = ",".join(burst)
        direct = burst is not None and self.bursts_direct
        pooler = ["--pooler", "transaction"] if self.bouncer is not None and not direct else []
        env = subprocess_env()
        env[AUDIT_URL] = url_string(self.database)
        # A SIGABRT then writes every thread's stack to the log: a stuck burst's evidence.
        env["PYTHONFAULTHANDLER"] = "1"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    *CLI,
                    "--log-level",
                    "INFO",
                    *pooler,
                    "worker",
                    APP,
                    "--database-url",
                    url_string(self.database if direct else self.worker_url()),
                    "--concurrency",
                    str(self.concurrency),
                    "--queues",
                    queues,
                    *(["--burst"] if burst is not None else []),
                    *(["--processes", str(processes)] if processes > 1 else []),
                    *(["--prefetch", str(self.prefetch)] if self.prefetch is not None else []),
                    "--poll-interval",
                    "0.2",
                    "--shutdown-grace",
                    "5",
                    "--wait-for-database",
                    "10",
                ],
                cwd=REPO_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        worker = WorkerProc(proc, log, serving=serving if burst is None else "names")
        worker.processes = processes
        (self.workers if burst is None else self.bursts).append(worker)
        return worker

    def most_held(self) -> int:
        """The most running jobs a worker holds: its threads, the most it claims ahead
        (``--prefetch``, or the adaptive buffer's ceiling, PREFETCH_MAX_FACTOR x threads),
        and a batch of completions being retried (one a thread: a thread that adds its next
        completion while the batch is retried waits, keeping its slot)."""
        ahead = PREFETCH_MAX_FACTOR * self.concurrency if self.prefetch is None else self.prefetch
        return 2 * self.concurrency + ahead

    def live(self) -> list[WorkerProc]:
        """Workers running and not told to leave (stopped ones included)."""
        return [w for w in self.workers if w.alive() and not w.leaving]

    def running(self) -> list[WorkerProc]:
        """Live workers that are not stopped."""
        return [w for w in self.live() if not w.stopped]

    def signal(self, worker: WorkerProc, signum: int) -> None:
        if signum in (signal.SIGTERM, signal.SIGKILL):
            worker.leaving = True
            worker.term = signum == signal.SIGTERM
        if signum == signal.SIGSTOP:
            worker.stopped = True
        if signum == signal.SIGCONT:
            worker.stopped = False
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.pid, signum)

    def signal_pid(self, pid: int, signum: int) -> None:
        """Signal one of a supervisor's worker processes (the supervisor decides what next)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    def unexpected_exits(self) -> list[WorkerProc]:
        """Workers that exited without being told to."""
        return [w for w in self.workers if not w.alive() and not w.leaving]

    def close(self) -> None:
        for worker in [*self.workers, *self.bursts]:
            for child in worker.children():  # a supervisor's: they would drain, not die
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
            if worker.alive():
                with contextlib.suppress(ProcessLookupError):
                    worker.proc.kill()  # SIGKILL also ends a stopped process
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.proc.wait(10)
        if self.proxy is not None:
            self.proxy.close()
        if self.bouncer is not None:
            self.bouncer.stop()

    def output(self, worker: WorkerProc, most: int = 6000) -> str:
        """The end of the worker's log (its last ``most`` characters)."""
        return worker.log.read_text(errors="replace")[-most:]


@contextlib.contextmanager
def worker_role(server: URL, database: URL) -> Iterator[str]:
    """A login role of the seed's own for its workers, with the rights they use in the seed's
    database and no connection limit yet; dropped at the end (after the database is).

    The ``conn_limit`` fault lowers its CONNECTION LIMIT, so that the real server refuses
    the workers' new connections ("too many connections for role"), with no server setting
    touched: the role is the seed's, and so is what it may reach.
    """
    role = f"{database.database}_w"
    admin = admin_engine(server)
    seed = admin_engine(database)
    try:
        with admin.connect() as conn:
            quoted = conn.dialect.identifier_preparer.quote(role)
            db = conn.dialect.identifier_preparer.quote(str(database.database))
            conn.execute(sa.text(f"CREATE ROLE {quoted} LOGIN"))
            conn.execute(sa.text(f"GRANT CONNECT ON DATABASE {db} TO {quoted}"))
        with seed.connect() as conn:
            conn.execute(sa.text(f"GRANT USAGE ON SCHEMA public TO {quoted}"))
            conn.execute(sa.text(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {quoted}"))
            conn.execute(sa.text(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {quoted}"))
        seed.dispose()
        yield role
    finally:
        with seed.connect() as conn:
            conn.execute(
                sa.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = :r"
                ),
                {"r": role},
            )
            # Its rights in the seed's database and on the database itself: then it can go.
            conn.execute(sa.text(f"DROP OWNED BY {quoted}"))
        seed.dispose()
        with admin.connect() as conn:
            conn.execute(sa.text(f"DROP ROLE IF EXISTS {quoted}"))
        admin.dispose()


def set_connection_limit(engine: sa.Engine, role: str, limit: int | None) -> int:
    """Set ``role``'s CONNECTION LIMIT: ``limit``, or its connections now when ``limit`` is 0
    (no new one), or none when None. Returns the limit set (-1: none)."""
    with engine.connect() as conn:
        if limit == 0:
            limit = conn.execute(
                sa.text("SELECT count(*) FROM pg_stat_activity WHERE usename = :r"), {"r": role}
            ).scalar_one()
        value = -1 if limit is None else int(limit)
        quoted = conn.dialect.identifier_preparer.quote(role)
        conn.execute(sa.text(f"ALTER ROLE {quoted} CONNECTION LIMIT {value}"))
        conn.commit()
    return value


def checker_engine(database: URL) -> sa.Engine:
    """The checker's engine: direct, named so no fault takes its connections."""
    return sa.create_engine(
        database, pool_size=4, max_overflow=4, connect_args={"application_name": CHECKER_APP}
    )
