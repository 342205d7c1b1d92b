"""``python -m tests.model``: explore seeds for as long as asked, or replay one.

    python -m tests.model --duration 600            # new seeds back to back for 10 minutes
    python -m tests.model --seed 7 --duration 600   # seeds 7, 8, 9, ...
    python -m tests.model --replay 7                # seed 7's schedule again, once
    python -m tests.model --replay 7 --faults none  # the same operations, without faults

The server is ``SA_JOBQUEUE_TEST_DATABASE_URL``, or an embedded one (pgserver), as for the
tests; each seed gets a database cloned from a template migrated once per run. The exit
status is 1 when a seed found a violation (its report is printed: seed, invariant, evidence,
schedule), else 0. A replay needs the options the failing run had (``--steps``,
``--workers``, ``--faults``...), which the report's replay line repeats.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator

import sqlalchemy as sa
from sqlalchemy.engine import URL

from sa_jobqueue.database import create_engine, normalise_url
from sa_jobqueue.migrations import upgrade
from tests.helpers.databases import drop_database, recreate_database
from tests.model.cluster import SERVINGS
from tests.model.runner import run_seed
from tests.model.schedule import (
    CI_FAULTS,
    CI_OPERATIONS,
    CI_PLANS,
    FAULTS,
    OPERATIONS,
    PLANS,
    PREFETCH,
    Config,
)


@contextlib.contextmanager
def server() -> Iterator[URL]:
    configured = os.environ.get("SA_JOBQUEUE_TEST_DATABASE_URL")
    if configured:
        yield normalise_url(configured)
        return
    import pgserver

    datadir = tempfile.mkdtemp(prefix="sajq-pgdata-")
    pg = pgserver.get_server(datadir, cleanup_mode="stop")  # type: ignore[attr-defined]
    try:
        yield normalise_url(pg.get_uri())
    finally:
        pg.cleanup()
        shutil.rmtree(datadir, ignore_errors=True)


@contextlib.contextmanager
def template(url: URL) -> Iterator[str]:
    name = f"sajq_mctemplate_{os.getpid()}"
    engine = create_engine(recreate_database(url, name), poolclass=sa.pool.NullPool)
    upgrade(engine)
    engine.dispose()
    try:
        yield name
    finally:
        drop_database(url, name)


def parse_faults(text: str) -> frozenset[str]:
    if text == "all":
        return frozenset(FAULTS)
    if text == "none":
        return frozenset()
    if text == "ci":
        return CI_FAULTS
    chosen = frozenset(t.strip() for t in text.split(",") if t.strip())
    unknown = chosen - set(FAULTS)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown faults {sorted(unknown)}; known: {FAULTS}")
    return chosen


def parse_prefetch(text: str) -> tuple[int | None, ...]:
    try:
        return tuple(None if p == "adaptive" else int(p) for p in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError("a list of: adaptive, or a number of jobs") from None


def parse_ops(text: str) -> dict[str, int]:
    """``all``, ``ci``, or either followed by (or just) ``name=weight,...`` changing weights
    (0 leaves one out): ``ci,burst=10`` is the CI mix with more bursts."""
    parts = [p for p in text.split(",") if p]
    weights = dict(OPERATIONS)
    if parts and parts[0] in ("all", "ci"):
        weights = dict(CI_OPERATIONS) if parts.pop(0) == "ci" else dict(OPERATIONS)
    for part in parts:
        name, _, weight = part.partition("=")
        if name not in weights:
            raise argparse.ArgumentTypeError(f"unknown operation {name}; known: {list(weights)}")
        weights[name] = int(weight)
    return weights


def parse_servings(text: str) -> tuple[str, ...]:
    chosen = tuple(t.strip() for t in text.split(",") if t.strip())
    unknown = set(chosen) - set(SERVINGS)
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"a list of {list(SERVINGS)}, not {text!r}")
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.model", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--seed", type=int, help="the first seed (default: a random one)")
    parser.add_argument("--replay", type=int, metavar="SEED", help="run this one seed once")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds to explore")
    parser.add_argument("--steps", type=int, default=100, help="steps per seed")
    parser.add_argument("--clients", type=int, default=3, help="client threads per seed")
    parser.add_argument("--workers", type=int, default=2, help="worker processes per seed")
    parser.add_argument("--concurrency", type=int, default=3, help="threads per worker")
    parser.add_argument(
        "--faults",
        type=parse_faults,
        default=frozenset(FAULTS),
        help="all (default), none, ci, or a comma-separated list of " + ",".join(FAULTS),
    )
    parser.add_argument(
        "--ops",
        type=parse_ops,
        default=dict(OPERATIONS),
        help="all (default), ci, or name=weight,... to change weights",
    )
    parser.add_argument(
        "--fault-rate", type=float, default=0.07, help="the chance that a step is a fault"
    )
    parser.add_argument("--max-stop-ms", type=int, default=3500, help="longest SIGSTOP (CI: 2500)")
    parser.add_argument(
        "--ci-plans",
        action="store_true",
        help="the CI run's handlers (CI_PLANS; today all of them)",
    )
    parser.add_argument(
        "--prefetch",
        type=parse_prefetch,
        default=PREFETCH,
        help="the workers' --prefetch each seed draws from: adaptive, N, or a list (default:"
        " adaptive,2; CI: adaptive)",
    )
    parser.add_argument(
        "--servings",
        type=parse_servings,
        default=tuple(SERVINGS),
        help="how the workers may name their queues, taken in turn: a list of "
        + ",".join(SERVINGS)
        + " (default: all three)",
    )
    parser.add_argument(
        "--supervised",
        type=float,
        default=0.2,
        help="the chance that a seed's first worker is a supervisor, --processes 2 (default 0.2)",
    )
    parser.add_argument("--keep-going", action="store_true", help="explore on after a violation")
    args = parser.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the seed's workers, pooler and database are cleaned up.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    config = Config(
        steps=args.steps,
        clients=args.clients,
        workers=args.workers,
        concurrency=args.concurrency,
        faults=args.faults,
        operations=args.ops,
        plans=CI_PLANS if args.ci_plans else PLANS,
        max_stop_ms=args.max_stop_ms,
        fault_rate=args.fault_rate,
        prefetch=args.prefetch,
        servings=args.servings,
        supervised=args.supervised,
    )
    replay = _replay_flags(args)
    failed = 0
    with server() as url, template(url) as name:
        if args.replay is not None:
            outcome = run_seed(url, name, args.replay, config, say=print)
            print(outcome.report(replay), flush=True)
            return 0 if outcome.ok else 1
        seed = args.seed if args.seed is not None else random.randrange(2**31)
        end = time.monotonic() + args.duration
        runs = 0
        while time.monotonic() < end:
            outcome = run_seed(url, name, seed, config)
            runs += 1
            print(outcome.report(replay), flush=True)
            if not outcome.ok:
                failed += 1
                if not args.keep_going:
                    break
            seed += 1
        print(f"{runs} seeds, {failed} with violations", flush=True)
    return 1 if failed else 0


def _replay_flags(args: argparse.Namespace) -> str:
    flags = ""
    if args.steps != 100:
        flags += f" --steps {args.steps}"
    if args.clients != 3:
        flags += f" --clients {args.clients}"
    if args.workers != 2:
        flags += f" --workers {args.workers}"
    if args.concurrency != 3:
        flags += f" --concurrency {args.concurrency}"
    if args.faults != frozenset(FAULTS):
        flags += " --faults " + (",".join(sorted(args.faults)) or "none")
    if args.ci_plans:
        flags += " --ci-plans"
    if args.fault_rate != 0.07:
        flags += f" --fault-rate {args.fault_rate}"
    if args.prefetch != PREFETCH:
        flags += " --prefetch " + ",".join(
            "adaptive" if p is None else str(p) for p in args.prefetch
        )
    if args.servings != tuple(SERVINGS):
        flags += " --servings " + ",".join(args.servings)
    if args.supervised != 0.2:
        flags += f" --supervised {args.supervised}"
    if args.max_stop_ms != 3500:
        flags += f" --max-stop-ms {args.max_stop_ms}"
    if args.ops != dict(OPERATIONS):
        # The shorter of: the changes to all the operations, or "ci" and the changes to it.
        ways = [
            [f"{k}={v}" for k, v in args.ops.items() if OPERATIONS.get(k) != v],
            ["ci"] + [f"{k}={v}" for k, v in args.ops.items() if CI_OPERATIONS.get(k) != v],
        ]
        flags += " --ops " + ",".join(min(ways, key=len))
    return flags


if __name__ == "__main__":
    sys.exit(main())
