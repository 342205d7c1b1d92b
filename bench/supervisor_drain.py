"""No-op and writing drains: ``worker --processes 2`` against two separately started workers.

    bench/.venv/bin/python bench/supervisor_drain.py [--jobs N] [--rounds R] [--processes P]

Uses $DATABASE_URL's server (a database ``bench_supervisor`` is created and dropped). Each
round drains ``--jobs`` jobs of each kind three times, alternating: with ``--processes``
separately started ``sa-jobqueue worker`` commands (each in a session of its own, as the
harness starts every command), with as many started by one shell (one session), and with one
``sa-jobqueue worker --processes P`` (a supervisor whose children are the workers, in its
session). On a machine other work keeps busy, the kernel's autogroup scheduling gives each
session an equal share of the CPU: the one-session shape is then the fair comparison. The
drains are the benchmark's own (:func:`bench.harness.drain`: warmed up, started together,
verified exactly once); the rate is jobs per second from the first handler start to the last
finish (or, past ``--max-drain-seconds``, the jobs finished by then), and the workers' CPU per
job is their process trees' (the supervisor's included). Prints each drain, then the medians
and the supervisor's ratio per kind (the target: at least 0.95).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if sys.path and Path(sys.path[0]).resolve() == ROOT / "bench":
    sys.path[0] = str(ROOT)

from bench import harness  # noqa: E402
from bench.adapters.base import Kind  # noqa: E402
from bench.adapters.sa_jobqueue_adapter import (  # noqa: E402
    SaJobqueue,
    SaJobqueueOneSession,
    SaJobqueueProcesses,
)

DATABASE = "bench_supervisor"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--max-drain-seconds", type=float, default=30.0)
    return p.parse_args()


def main() -> int:
    args = parse_args()
    url = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    separate, supervised = SaJobqueue(), SaJobqueueProcesses(args.processes)
    shapes = {
        f"{args.processes} workers": (separate, args.processes),
        "one session": (SaJobqueueOneSession(args.processes), 1),
        f"--processes {args.processes}": (supervised, 1),
    }
    kinds: tuple[Kind, ...] = ("noop", "write")
    rates: dict[tuple[Kind, str], list[float]] = {(k, s): [] for k in kinds for s in shapes}
    cpu: dict[tuple[Kind, str], list[float]] = {(k, s): [] for k in kinds for s in shapes}
    dsn = harness.recreate_database(url, DATABASE)
    try:
        separate.install(dsn)
        for _ in range(args.rounds):
            for kind in kinds:
                for shape, (system, procs) in shapes.items():
                    result = harness.drain(
                        system, dsn, args.jobs, kind=kind, procs=procs, cap=args.max_drain_seconds
                    )
                    if not result.verified or result.error:
                        print(f"{kind} {shape}: failed: {result.as_dict()}", file=sys.stderr)
                        return 1
                    rates[kind, shape].append(result.rate)
                    cpu[kind, shape].append(result.worker_us_per_job)
                    cut = "" if result.complete else f" (cut: {result.finished} done)"
                    print(
                        f"{kind:5} {shape:14} {result.rate:8.0f} jobs/s"
                        f"  worker CPU {result.worker_us_per_job:6.0f} us/job{cut}",
                        flush=True,
                    )
    finally:
        harness.drop_database(url, DATABASE)
    print(f"medians of {args.rounds} rounds, {args.jobs} jobs each:")
    for kind in kinds:
        base, one_session, ours = (statistics.median(rates[kind, shape]) for shape in shapes)
        print(
            f"  {kind:5} jobs/s: separate {base:6.0f}, one session {one_session:6.0f},"
            f" supervised {ours:6.0f}; ratio {ours / base:.3f} (to one session"
            f" {ours / one_session:.3f})"
        )
        base, one_session, ours = (statistics.median(cpu[kind, shape]) for shape in shapes)
        print(
            f"  {kind:5} worker CPU us/job: separate {base:4.0f}, one session {one_session:4.0f},"
            f" supervised {ours:4.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
