"""The path of one job through the worker: which of the package's modules it passes, in order.

    bench/.venv/bin/python bench/job_path.py [--handler write|noop|write_async] [--show]

Uses $DATABASE_URL's server (a database ``bench_job_path`` is created and dropped). Starts one
in-process ``Worker`` on an empty queue and lets it settle, then traces every call and return
of the package's code (``sys.settrace`` on each of the worker's threads) while one job is
enqueued, claimed, run and completed, and stops tracing once the job has succeeded.

It prints, for each thread that ran the package's code in that window, the modules in the
order it was in them (a module is left when its frame calls into another of the package's
modules or returns to one; ``(handler)`` is the handler's own code, which the package's code
such as a session's events may be called from), and three counts over the threads that
carried the job: the distinct modules, the visits (each entry into a module), and the returns
to a module already left earlier in the same thread. A worker's idle work in the same window
(the heartbeat's tick, the upkeep loop) is shown apart, under the thread that ran it: it is
not the job's. The counts are given twice: over every module, and over the modules that own a
step of the job, without the leaves of :data:`LEAVES` (each with the reason it is one).

The counts are of the code as it runs, not of wall time: they do not depend on the machine's
load, and a run repeats them call for call, up to which thread wins a race.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if sys.path and Path(sys.path[0]).resolve() == ROOT / "bench":
    sys.path[0] = str(ROOT)

import sqlalchemy as sa  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from bench import harness  # noqa: E402

PACKAGE = "sa_jobqueue"
RESULTS = sa.table("path_results", sa.column("job_id"))
#: Threads whose work is the worker's own upkeep, whatever the job does: shown, not counted.
IDLE_THREADS = ("heartbeat", "upkeep", "listener", "pulse", "history")
STATUS = sa.text("SELECT status FROM sa_jobqueue_jobs WHERE id = :id")
#: Modules a reader of the job's path does not follow into, by prefix, and why.
LEAVES: dict[str, str] = {
    "sa_jobqueue._sql.": "statement builders: a statement is read by its name",
    "sa_jobqueue._deadlines": "connection plumbing: a guard around a statement",
    "sa_jobqueue._driver": "connection plumbing: the driver's statement text",
    "sa_jobqueue.database": "connection plumbing: the engine's checkout events",
    "sa_jobqueue._context": "data: the handler's context",
    "sa_jobqueue.worker._claimed": "data: a claimed row",
    "sa_jobqueue.queue": "lookup: the task of a name",
    "sa_jobqueue._registry": "lookup: the task of a name",
    "sa_jobqueue._backoff": "lookup: the job's retry policy",
    "sa_jobqueue.observability.": "the observers' hooks",
    "sa_jobqueue.worker._settlement": "a pure function: the verdict of an attempt",
}
#: What a trail shows for code outside the package.
OUTSIDE = ("(outside)", "(handler)")


class Tracer:
    """Records, per thread, the package module each traced event leaves the thread in."""

    def __init__(self) -> None:
        self.active = False
        self.events: dict[str, list[str]] = defaultdict(list)

    def _innermost(self, frame: FrameType | None) -> str:
        """The package module, or the handler, that the code at ``frame`` runs for."""
        while frame is not None:
            name = frame.f_globals.get("__name__", "")
            if name.startswith(PACKAGE):
                return str(name)
            if name == "__main__":  # this script: the handlers
                return "(handler)"
            frame = frame.f_back
        return "(outside)"

    def _note(self, here: str) -> None:
        trail = self.events[threading.current_thread().name]
        if not trail or trail[-1] != here:
            trail.append(here)

    def trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        if not self.active or event != "call":
            return None
        name = frame.f_globals.get("__name__", "")
        if not name.startswith(PACKAGE):
            return None
        self._note(name)
        frame.f_trace_lines = False
        return self._local

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "return" and self.active:
            self._note(self._innermost(frame.f_back))
        return self._local


def counted(trail: list[str], *, leaves: bool = True) -> list[str]:
    """``trail`` without what is outside the package and, unless ``leaves``, without the
    leaves (a module entered again after a leaf it called is one visit, not two)."""
    kept: list[str] = []
    for module in trail:
        if module in OUTSIDE or (not leaves and module.startswith(tuple(LEAVES))):
            continue
        if not kept or kept[-1] != module:
            kept.append(module)
    return kept


def counts(trail: list[str]) -> tuple[set[str], int, int]:
    """The distinct modules of ``trail``, its visits, and its returns to a module left before."""
    modules = [m for m in trail if m not in OUTSIDE]
    seen: set[str] = set()
    returns = 0
    for module in modules:
        if module in seen:
            returns += 1
        seen.add(module)
    return seen, len(modules), returns


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--handler", choices=("write", "noop", "write_async"), default="write")
    parser.add_argument("--show", action="store_true", help="print each thread's trail")
    args = parser.parse_args()
    admin = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    dsn = harness.recreate_database(admin, "bench_job_path")
    try:
        from sa_jobqueue import JobContext, JobQueue, Worker
        from sa_jobqueue.database import create_engine
        from sa_jobqueue.migrations import upgrade

        engine = create_engine(dsn)
        upgrade(engine)
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE path_results (job_id bigint PRIMARY KEY)")
        queue = JobQueue()

        def write(ctx: JobContext, payload: dict[str, int]) -> None:
            ctx.session.execute(sa.insert(RESULTS).values(job_id=ctx.job_id))

        def noop(ctx: JobContext, payload: dict[str, int]) -> None:
            pass

        async def write_async(ctx: JobContext, payload: dict[str, int]) -> None:
            await ctx.async_session.execute(sa.insert(RESULTS).values(job_id=ctx.job_id))

        handler = {"write": write, "noop": noop, "write_async": write_async}[args.handler]
        queue.task(handler)
        tracer = Tracer()
        threading.settrace(tracer.trace)
        worker = Worker(queue, engine, concurrency=4)
        runner = threading.Thread(target=worker.run, name="worker-main")
        runner.start()
        watcher = create_engine(dsn, pool_size=1)
        try:
            # Warm-up jobs, untraced, one after another: a worker's first jobs pay its imports
            # and caches, and a task's first run has no run time yet to be grouped by.
            for n in range(3):
                with Session(engine) as session, session.begin():
                    warm = queue.enqueue(session, args.handler, {"n": -n})
                _wait_succeeded(watcher, int(warm))
            with Session(engine) as session, session.begin():
                job = queue.enqueue(session, args.handler, {"n": 1})
                # Traced from the enqueue's commit (the application's, on this thread: not
                # traced) to the job's success.
                session.flush()
                tracer.active = True
            _wait_succeeded(watcher, int(job))
        finally:
            tracer.active = False
            worker.stop()
            runner.join()
            watcher.dispose()
        engine.dispose()
        _report(tracer, args)
        if asyncio.iscoroutinefunction(handler):
            print("(an async handler: the event loop's thread carries the handler)")
        return 0
    finally:
        harness.drop_database(admin, "bench_job_path")


def _wait_succeeded(engine: sa.Engine, job_id: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    with engine.connect() as conn:
        while conn.execute(STATUS, {"id": job_id}).scalar_one() != "succeeded":
            conn.rollback()
            if time.monotonic() > deadline:
                raise SystemExit(f"job {job_id} did not succeed within {timeout:.0f}s")
            time.sleep(0.002)


def _report(tracer: Tracer, args: argparse.Namespace) -> None:
    for leaves, what in ((True, "every module"), (False, "the modules owning a step")):
        job_modules: set[str] = set()
        visits = returns = 0
        print(f"-- {what}")
        for thread, trail in sorted(tracer.events.items()):
            modules, n, back = counts(counted(trail, leaves=leaves))
            idle = any(word in thread.lower() for word in IDLE_THREADS)
            label = "idle work, not counted" if idle else "the job's path"
            print(f"{thread} ({label}): {len(modules)} modules, {n} visits, {back} returns")
            if args.show and leaves:
                short = [m.removeprefix(PACKAGE + ".") for m in trail]
                print("    " + " > ".join(short))
            if not idle:
                job_modules |= modules
                visits += n
                returns += back
        print(
            f"one {args.handler} job, {what}: {len(job_modules)} modules on the job's threads,"
            f" {visits} visits, {returns} returns to a module already left"
        )
        for module in sorted(job_modules):
            print(f"    {module}")
    print("leaves (not counted in the second count):")
    for prefix, why in LEAVES.items():
        print(f"    {prefix}: {why}")


if __name__ == "__main__":
    raise SystemExit(main())
