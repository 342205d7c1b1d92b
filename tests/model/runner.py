"""One seed, end to end: a database, workers, the schedule played, quiescence, the checks.

Phases:

1. **Setup.** The seed's database is cloned from the migrated template, the checker's tables
   are created in it, and the schedule's workers start (direct, behind a fault proxy, or
   behind PgBouncer in transaction mode, as the schedule says).
2. **Play.** Each client thread plays its own steps (the schedule says which), each on its
   own connections: a step waits its gap (pacing, not synchronisation: the workers and the
   other clients run meanwhile), then runs: an operation through the public API, or a fault.
   A race step is played by every client: each waits for the others, then runs its part.
   Lasting faults are undone when their time is up. A sampler thread checks the instant's
   limits every 100 ms.
3. **Quiescence.** Faults stop and are undone (SIGCONT, the proxy accepts again); every queue
   is resumed (limits are kept: a capped queue must drain too); a worker is started if none
   runs. Then every job the checker created must end within :func:`quiescence_bound`.
4. **Checks.** The invariants run on the final tables and the model; the workers are stopped
   with SIGTERM and must exit 0.
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from sa_jobqueue.models import jobs_table, workers_table
from sa_jobqueue.ops import resume_queue
from sa_jobqueue.worker import STOP_MARGIN
from tests.helpers.databases import cloned_database
from tests.model import bulk, invariants
from tests.model.cluster import QUEUES, Cluster, checker_engine, worker_role
from tests.model.faults import Faults
from tests.model.model import Change, Model, Violation
from tests.model.operations import Operations
from tests.model.schedule import ALL, Config, Schedule, generate
from tests.model.tasks import metadata

j = jobs_table.c
SAMPLE_EVERY = 0.1
#: How long a worker may take to (re)register once everything is quiet, in seconds.
REGISTRY_BOUND = 10.0
#: How long the first workers may take to start (import, connect, register), in seconds.
STARTUP_BOUND = 20.0
#: How long a SIGTERMed worker may take to exit: the worker's promise, its shutdown grace
#: (5 s) and STOP_MARGIN whatever the network does (docs/explanation/faults.md), and 5 s for
#: the process to end.
EXIT_BOUND = 5.0 + STOP_MARGIN + 5.0
#: The same after a blackhole fault (the promise holds on silent connections too).
SILENCED_EXIT_BOUND = EXIT_BOUND


#: A supervisor's log line for a worker process that exited while not asked to stop, but
#: for the checker's SIGKILLs: "worker process 1 (pid 123) exited with status 1 after 2.0s:
#: starting a new one in 1s (crash 1 in a row)", or "... exited 0 unasked after ...".
CRASH = re.compile(r"worker process \d+ \(pid \d+\) (exited with status|exited 0 unasked)")


def quiescence_bound(jobs: int, threads: int) -> float:
    """Seconds every job gets to end once nothing holds it.

    A job may need: a lease to expire (2 s, or 3 s when enqueued with a longer one), its
    backoffs (at most 3 attempts x 0.5 s), its run_at (at most 1.5 s), its longest action
    (3 s), each in turn down a chain of dependencies; and the queue's cap of 1 may make the
    jobs run one at a time (about 0.1 s each for most plans). 30 s plus 0.15 s a job covers
    it on a loaded 2-core machine.
    """
    return 30.0 + 0.15 * jobs / max(1, min(threads, 3)) * 3


@dataclass
class Outcome:
    """What one seed did and found."""

    seed: int
    schedule: Schedule
    model: Model
    violations: list[Violation]
    seconds: float
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def report(self, replay: str = "") -> str:
        said: dict[int, list[str]] = {}
        for index, what in self.model.log:
            said.setdefault(index, []).append(what)
        lines = [
            f"seed {self.seed}: {'ok' if self.ok else 'VIOLATION'} after {self.seconds:.1f}s,"
            f" {len(self.model.jobs)} jobs"
            + (
                f"; replay with: python -m tests.model --replay {self.seed}{replay}"
                if not self.ok
                else ""
            )
        ]
        lines += ["  " + v.describe() for v in self.violations]
        lines += ["  note: " + n for n in self.notes]
        if not self.ok:
            for pid, stopped, resumed in self.model.stops:
                lines.append(f"  SIGSTOP of worker {pid} from {stopped} to {resumed}")
            lines.append("schedule:")
            lines.append(self.schedule.describe().split("\n")[0])
            for step in self.schedule.steps:
                done = "; ".join(said.get(step.index, ["not run"]))
                lines.append(f"{step.describe()}  -> {done}")
        return "\n".join(lines)


class Sampler(threading.Thread):
    """Runs :func:`invariants.sample` every 100 ms until stopped; keeps new violations."""

    def __init__(self, engine: sa.Engine, model: Model) -> None:
        super().__init__(daemon=True)
        self.engine, self.model = engine, model
        self.halt = threading.Event()
        self.seen: set[tuple[str, tuple[int, ...]]] = set()
        self.samples = 0

    def run(self) -> None:
        while not self.halt.wait(SAMPLE_EVERY):
            try:
                with self.engine.connect() as conn:
                    conn = conn.execution_options(isolation_level="REPEATABLE READ")
                    with conn.begin():
                        found = invariants.sample(conn, self.model)
            except sa.exc.DBAPIError as exc:  # the checker's own connection: note, go on
                self.model.log.append((-1, f"sampler: {exc.__class__.__name__}"))
                continue
            except Exception as exc:  # a defect of the checker: say so, and stop sampling
                self.model.found.append(Violation("checker_error", (), f"sampler: {exc!r}"))
                return
            self.samples += 1
            for v in found:
                # A worker over its bound stays over it for a while: its first sample says it.
                key = (v.invariant, () if v.invariant == "worker_bound" else v.jobs)
                if key not in self.seen:
                    self.seen.add(key)
                    self.model.found.append(v)


def run_seed(
    server: URL,
    template: str,
    seed: int,
    config: Config,
    *,
    logs: Path | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> Outcome:
    """Play seed ``seed``'s schedule on a database cloned from ``template``; check it."""
    schedule = generate(seed, config)
    began = time.monotonic()
    model = Model()
    notes: list[str] = []
    logdir = logs or Path(tempfile.mkdtemp(prefix=f"sajq-mc-{seed}-"))
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(cloned_database(server, template, prefix="sajq_mc"))
        engine = checker_engine(url)
        metadata.create_all(engine)
        bulk.install(engine)
        cluster = Cluster.open(
            url, schedule.network, logdir, schedule.concurrency, schedule.prefetch
        )
        if schedule.network != "bouncer":  # the workers log in as a role of the seed's own
            cluster.role = stack.enter_context(worker_role(server, url))
        cluster.bursts_direct = config.bursts_direct
        cluster.servings, cluster.supervised = schedule.servings, schedule.supervised
        model.most_held = cluster.most_held()
        model.threads = schedule.concurrency
        sampler = Sampler(engine, model)
        ops: Operations | None = None
        try:
            ops = Operations(engine, model, cluster)
            faults = Faults(cluster, engine, model)
            for _ in range(schedule.workers):
                cluster.start_worker()
            _registered(engine, cluster, STARTUP_BOUND, enough=3.0)  # faults need something to hit
            phases = {"start": time.monotonic() - began}
            sampler.start()
            _play(schedule, ops, faults, model)
            phases["play"] = time.monotonic() - began - sum(phases.values())
            say(f"seed {seed}: {len(schedule.steps)} steps played, quiescing")
            faults.due(None)  # the faults end with the play; the bursts' bound starts
            ops.settle_bursts()
            _quiesce(engine, cluster, faults, model)
            bound = quiescence_bound(len(model.jobs), schedule.workers * schedule.concurrency)
            ids = list(model.jobs)
            deadline = time.monotonic() + bound
            while time.monotonic() < deadline:
                with engine.connect() as conn:
                    if not invariants.settled(conn, ids):
                        break
                time.sleep(0.1)
            phases["settle"] = time.monotonic() - began - sum(phases.values())
            for watcher in ops.watchers:  # each burst has exited or been killed by now
                watcher.join(10)
            sampler.halt.set()
            sampler.join(5)
            pids = _registered(engine, cluster)
            for w in cluster.running():
                if w.supervised and len(w.children()) != w.processes:
                    model.found.append(
                        Violation(
                            "registry",
                            (),
                            f"supervisor {w.pid} runs worker processes {w.children()}, not"
                            f" {w.processes}, {REGISTRY_BOUND:g}s after quiescence",
                        )
                    )
            model.termed = {w.pid for w in cluster.workers if w.term}
            with engine.connect() as conn:
                final = invariants.Final.read(conn)
            violations = list(model.found) + invariants.at_quiescence(model, final, pids)
            phases["checks"] = time.monotonic() - began - sum(phases.values())
            violations += _exits(cluster, model)
            phases["stop"] = time.monotonic() - began - sum(phases.values())
            checked = "".join(f"; {n} {what} checked" for what, n in model.checked.items())
            runs = [s for began in final.starts.values() for s in began]
            grouped = Counter(s.task for s in runs if s.grouped)
            notes.append(
                f"{sampler.samples} samples{checked}; {grouped.total()} of {len(runs)} audited"
                f" attempts grouped {dict(grouped)}; quiescence bound {bound:.0f}s; seconds "
                + ", ".join(f"{k} {v:.1f}" for k, v in phases.items())
                + f"; logs {logdir}"
            )
        finally:
            sampler.halt.set()
            if ops is not None:
                ops.close()
            cluster.close()
            engine.dispose()
    return Outcome(seed, schedule, model, violations, time.monotonic() - began, notes)


#: How long a race's client waits for the others to arrive, in seconds.
RACE_BOUND = 60.0


def _play(schedule: Schedule, ops: Operations, faults: Faults, model: Model) -> None:
    """Play every client's steps, the clients in threads of their own; return when all end."""
    races = {
        s.index: threading.Barrier(schedule.clients, timeout=RACE_BOUND)
        for s in schedule.steps
        if s.client == ALL
    }

    def client(c: int) -> None:
        for step in schedule.of(c):
            _pause(step.gap_ms / 1000, faults)
            what = step
            try:
                if step.client == ALL:
                    what = step.part(c)
                    races[step.index].wait()
                said = faults.run(what) if what.fault else ops.run(what)
            except threading.BrokenBarrierError:
                said = "race abandoned"
                model.found.append(
                    Violation("checker_error", (), f"step {step.index}: client {c} waited alone")
                )
            except Exception as exc:
                said = f"raised {exc.__class__.__name__}: {exc}"
                model.found.append(
                    Violation("api_error", (), f"step {step.index} c{c} {what.kind}: {said}")
                )
            model.log.append((step.index, said if step.client != ALL else f"c{c}: {said}"))

    threads = [threading.Thread(target=client, args=(c,)) for c in range(schedule.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _pause(seconds: float, faults: Faults) -> None:
    """Let the workers run for ``seconds``, undoing lasting faults as their time comes."""
    end = time.monotonic() + seconds
    while True:
        faults.due(time.monotonic())
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, 0.05))


def _quiesce(engine: sa.Engine, cluster: Cluster, faults: Faults, model: Model) -> None:
    faults.due(None)
    with Session(engine) as session, session.begin():
        for q in QUEUES:
            resume_queue(session, q)
    with engine.connect() as conn:
        at = conn.execute(sa.select(sa.func.clock_timestamp())).scalar_one()
    model.changes += [Change(-1, q, "resume", False, at) for q in QUEUES]
    if not cluster.running():
        cluster.start_worker()


def _registered(
    engine: sa.Engine, cluster: Cluster, bound: float = REGISTRY_BOUND, enough: float | None = None
) -> list[int]:
    """The live workers' pids, once each is in the registry (or after ``bound`` seconds).

    With ``enough``, stop waiting as soon as one is registered and ``enough`` seconds have
    passed: the registry invariant, not the start, says whether each worker is there.
    """
    start = time.monotonic()
    while True:
        # A supervisor's worker processes, read each time: one it restarted has a new pid.
        pids = [p for w in cluster.running() for p in w.worker_pids()]
        if time.monotonic() >= start + bound:
            return pids
        with engine.connect() as conn:
            seen = list(conn.execute(sa.select(workers_table.c.pid)).scalars())
        supervisors = [w for w in cluster.running() if w.supervised]
        # A supervisor restarting a killed worker process has fewer than its PROCESSES now.
        full = all(len(w.children()) == w.processes for w in supervisors)
        if full and all(seen.count(p) == 1 for p in pids):
            return pids
        if enough is not None and seen and time.monotonic() > start + enough:
            return pids
        time.sleep(0.1)


def _exits(cluster: Cluster, model: Model) -> list[Violation]:
    """Workers that exited untold, and workers told to stop (SIGTERM) that did not exit 0.

    Exit status 1 is allowed after a blackhole fault: a handler blocked on a silent
    connection can outlast the shutdown grace, and a worker that stops with jobs still
    running exits 1 (docs/explanation/faults.md). Without one, every plan action ends
    within 3 s, under the 5 s grace.
    """
    allowed = (0, 1) if model.silenced else (0,)
    found = [
        Violation(
            "worker_exit",
            (),
            f"worker {w.pid} exited {w.proc.returncode} untold:\n" + cluster.output(w),
        )
        for w in cluster.unexpected_exits()
    ]
    for w in [w for w in cluster.workers if w.supervised]:
        # A supervisor restarts a worker process that exits: the exit is in its log only.
        crashes = [line for line in cluster.output(w, 10**7).splitlines() if CRASH.search(line)]
        if crashes:
            found.append(
                Violation(
                    "worker_exit",
                    (),
                    f"worker processes of supervisor {w.pid} exited untold:\n    "
                    + "\n    ".join(crashes[:8])
                    + "\n"
                    + cluster.output(w),
                )
            )
    for w in cluster.running():
        cluster.signal(w, signal.SIGTERM)
    bound = SILENCED_EXIT_BOUND if model.silenced else EXIT_BOUND
    deadline = time.monotonic() + bound
    for w in cluster.workers:
        while w.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
    for w in cluster.workers:
        code = w.proc.returncode
        if w.term and code is not None and code not in allowed:
            found.append(
                Violation(
                    "clean_stop",
                    (),
                    f"worker {w.pid} exited {code} after SIGTERM:\n" + cluster.output(w),
                )
            )
        if w.term and code is None:
            # Its threads' stacks go to its log (faulthandler), to show what it waits on.
            w.proc.send_signal(signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.proc.wait(5)
            found.append(
                Violation(
                    "clean_stop",
                    (),
                    f"worker {w.pid} still running {bound}s after SIGTERM:\n" + cluster.output(w),
                )
            )
    return found
