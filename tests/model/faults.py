"""Each fault of a schedule, done to the seed's own workers, network or pooler.

A fault that lasts (a SIGSTOP, a refusing proxy) is undone by the runner when its time is up,
and every lasting fault is undone at quiescence. The database's connections are terminated by
``pg_terminate_backend`` on this seed's database only, and only those named ``sa_jobqueue``
(the workers'); the checker's and the audit's connections have names of their own.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import sqlalchemy as sa

from sa_jobqueue.models import workers_table
from sa_jobqueue.worker._supervisor import CRASH_LIMIT, CRASH_WINDOW
from tests.model.cluster import Cluster, WorkerProc, restart_bouncer, set_connection_limit
from tests.model.model import Model
from tests.model.schedule import Step

#: The most children of one supervisor the checker SIGKILLs within CRASH_WINDOW: two short
#: of CRASH_LIMIT, which would end the supervisor (a crash loop) as documented.
KILLS_PER_WINDOW = CRASH_LIMIT - 2


@dataclass
class Faults:
    """Injects faults into one cluster; remembers what must be undone, and when."""

    cluster: Cluster
    engine: sa.Engine
    model: Model
    #: Keep at least this many workers running: a fault that would leave fewer starts one.
    floor: int = 1
    #: (monotonic deadline, what undoes the fault)
    pending: list[tuple[float, Callable[[], None]]] = field(default_factory=list)
    #: The clients inject and undo faults from their own threads: one at a time.
    lock: threading.RLock = field(default_factory=threading.RLock)

    def clock(self) -> sa.engine.Row[tuple[object]]:
        with self.engine.connect() as conn:
            return conn.execute(sa.select(sa.func.clock_timestamp())).one()

    def run(self, step: Step) -> str:
        handler: Callable[[Step], str] = getattr(self, "fault_" + step.kind)
        with self.lock:
            return handler(step)

    def due(self, now: float | None = None) -> None:
        """Undo the faults whose time is up (all of them, when ``now`` is None)."""
        with self.lock:
            keep = []
            for deadline, undo in self.pending:
                if now is None or deadline <= now:
                    undo()
                else:
                    keep.append((deadline, undo))
            self.pending = keep

    def _pick(self, step: Step, among: list[WorkerProc]) -> WorkerProc | None:
        return among[step.args["pick"] % len(among)] if among else None

    def _pick_pid(self, step: Step, among: list[int]) -> int | None:
        # Another digit of the pick than _pick's, so that the two choices are not tied.
        return among[step.args["pick"] // 7 % len(among)] if among else None

    def _registered(self) -> list[WorkerProc]:
        """Running workers that have registered: their SIGTERM handler is installed by then
        (for a supervisor, whose children register, once one has: the supervisor's handler
        is installed before it starts them).

        A SIGTERM that reaches a worker still importing its app ends it with the default
        action (-15), which says nothing about the queue: a graceful stop picks among these.
        """
        with self.engine.connect() as conn:
            pids = set(conn.execute(sa.select(workers_table.c.pid)).scalars())
        return [w for w in self.cluster.running() if pids.intersection(w.worker_pids())]

    def _top_up(self) -> None:
        while len(self.cluster.running()) < self.floor:
            self.cluster.start_worker()

    def fault_sigkill(self, step: Step) -> str:
        """SIGKILL a worker; for a supervisor, one of its worker processes (it starts a new
        one after a backoff), as long as the supervisor would not take the kills for a crash
        loop (CRASH_LIMIT crashes within CRASH_WINDOW end it, as documented)."""
        worker = self._pick(step, self.cluster.live())
        if worker is None:
            return "no worker"
        if worker.supervised:
            now = time.monotonic()
            worker.kills = [t for t in worker.kills if t > now - CRASH_WINDOW]
            if len(worker.kills) >= KILLS_PER_WINDOW:
                return f"spared supervisor {worker.pid} ({len(worker.kills)} children killed)"
            child = self._pick_pid(step, worker.children())
            if child is None:
                return f"supervisor {worker.pid} has no worker process"
            worker.kills.append(now)
            self.cluster.signal_pid(child, signal.SIGKILL)
            return f"killed {child}, a worker process of supervisor {worker.pid}"
        self.cluster.signal(worker, signal.SIGKILL)
        self._top_up()
        return f"killed {worker.pid}"

    def fault_sigstop(self, step: Step) -> str:
        """SIGSTOP a worker for a while; for a supervisor, one of its worker processes."""
        worker = self._pick(step, self.cluster.running())
        if worker is None:
            return "no worker"
        child = self._pick_pid(step, worker.children()) if worker.supervised else None
        if worker.supervised and child is None:
            return f"supervisor {worker.pid} has no worker process"
        if child is None:
            self.cluster.signal(worker, signal.SIGSTOP)
        else:
            self.cluster.signal_pid(child, signal.SIGSTOP)
        stopped = worker.pid if child is None else child
        at = self.clock()[0]
        index = len(self.model.stops)
        self.model.stops.append((stopped, at, None))  # type: ignore[arg-type]

        def cont() -> None:
            if child is None:
                self.cluster.signal(worker, signal.SIGCONT)
            else:
                self.cluster.signal_pid(child, signal.SIGCONT)
            pid, stopped, _ = self.model.stops[index]
            self.model.stops[index] = (pid, stopped, self.clock()[0])  # type: ignore[assignment]

        self.pending.append((time.monotonic() + step.args["ms"] / 1000, cont))
        self._top_up()
        return f"stopped {stopped} for {step.args['ms']} ms"

    def fault_terminate(self, step: Step) -> str:
        with self.engine.connect() as conn:
            ended = conn.execute(
                sa.text(
                    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND application_name = 'sa_jobqueue'"
                )
            ).scalar_one()
        return f"terminated {ended} worker connections"

    def fault_restart(self, step: Step) -> str:
        worker = self._pick(step, self._registered())
        if worker is None:
            return "no worker"
        self.cluster.signal(worker, signal.SIGTERM)
        new = self.cluster.start_worker()
        return f"SIGTERM {worker.pid}, started {new.pid}"

    def fault_start_worker(self, step: Step) -> str:
        if len(self.cluster.live()) >= 4:
            return "enough workers"
        return f"started {self.cluster.start_worker().pid}"

    def fault_stop_worker(self, step: Step) -> str:
        worker = self._pick(step, self._registered())
        if worker is None:
            return "no worker"
        self.cluster.signal(worker, signal.SIGTERM)
        self._top_up()
        return f"SIGTERM {worker.pid}"

    def fault_blackhole(self, step: Step) -> str:
        assert self.cluster.proxy is not None
        self.model.silenced = True
        return f"silenced {self.cluster.proxy.silence()} connections"

    def fault_refuse(self, step: Step) -> str:
        proxy = self.cluster.proxy
        assert proxy is not None
        proxy.refuse(True)
        self.pending.append(
            (time.monotonic() + step.args["ms"] / 1000, lambda: proxy.refuse(False))
        )
        return f"refusing for {step.args['ms']} ms"

    def fault_cut_setup(self, step: Step) -> str:
        """The next ``count`` new connections through the proxy are cut at their first query
        after the handshake, as by a pooler or server restarting under clients that just
        connected; a worker starts into them (a starting worker's ping and schema check are
        its first connections). Whichever connections the cuts meet, a worker's or a
        burst's, each is a lost connection: tried again, not an exit. Cuts no connection met
        within ``ms`` are called off."""
        proxy = self.cluster.proxy
        assert proxy is not None
        proxy.cut_next_once_ready(step.args["count"])
        self.pending.append(
            (time.monotonic() + step.args["ms"] / 1000, lambda: proxy.cut_next_once_ready(0))
        )
        started = (
            "" if len(self.cluster.live()) >= 4 else f", started {self.cluster.start_worker().pid}"
        )
        return f"cutting the next {step.args['count']} connections at their setup{started}"

    def fault_conn_limit(self, step: Step) -> str:
        """The workers' role may open no new connection for a while: the server refuses them
        ("too many connections for role"). The ones open now go on, but one of them (the
        step's ``pick``) is ended, so that a worker must reconnect into the refusals."""
        role = self.cluster.role
        assert role is not None
        limit = set_connection_limit(self.engine, role, 0)
        with self.engine.connect() as conn:
            pids = list(
                conn.execute(
                    sa.text(
                        "SELECT pid FROM pg_stat_activity WHERE usename = :r"
                        " AND application_name = 'sa_jobqueue' ORDER BY pid"
                    ),
                    {"r": role},
                ).scalars()
            )
            if pids:
                pid = pids[step.args["pick"] % len(pids)]
                conn.execute(sa.select(sa.func.pg_terminate_backend(pid)))
        self.pending.append(
            (
                time.monotonic() + step.args["ms"] / 1000,
                lambda: set_connection_limit(self.engine, role, None) and None,
            )
        )
        return f"role {role} limited to its {limit} connections for {step.args['ms']} ms"

    def fault_bouncer_restart(self, step: Step) -> str:
        assert self.cluster.bouncer is not None
        restart_bouncer(self.cluster.bouncer)
        return "pgbouncer restarted"
