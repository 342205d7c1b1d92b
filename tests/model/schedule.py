"""A seed's schedule: the operations and faults one run plays, drawn as plain data.

:func:`generate` is a pure function of the seed and the :class:`Config`: the same pair gives
the same steps, which is what makes a seed a replayable bug report. A step names what to do
and with which arguments; what it acts on at run time (which job a cancel picks, which worker
a SIGKILL hits) is chosen by the runner from the step's ``pick`` among what exists then, so
the schedule replays exactly while the interleaving with the workers may differ.

The mix is configurable: ``Config.operations`` weights each operation, ``Config.faults`` says
which faults may be drawn. :data:`CI_FAULTS` and :data:`CI_OPERATIONS` are what the CI run
uses; what they leave out, and why, is said beside them.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sa_jobqueue.models import STATUSES
from tests.model.cluster import PATTERNS, QUEUES, SERVINGS
from tests.model.tasks import LATE, TASKS

#: Operation weights: how often each is drawn, relative to the others.
OPERATIONS: Mapping[str, int] = {
    "enqueue": 30,
    "enqueue_many": 6,
    #: A batch of 3 to 8 jobs of the ``quick`` task (fast plans only): run back to back, they
    #: share their threads' group commits, the worker's grouped path.
    "enqueue_quick": 8,
    "chain": 3,
    "group": 2,
    "chord": 2,
    "cancel": 6,
    "requeue": 4,
    "pause": 3,
    "resume": 4,
    "set_cap": 4,
    "set_key_cap": 2,
    "set_rate": 2,
    "set_key_rate": 2,
    "clear_limits": 3,
    "wait_result": 3,
    "race_deps": 3,
    "race_key": 3,
    "race_cancel": 2,
    "burst": 2,
    #: ``typed`` jobs whose payload does not fit their type: refused at enqueue, or made
    #: not to fit in the enqueue's transaction (as by a later deploy), then failed by the
    #: worker that rebuilds it.
    "enqueue_typed": 3,
    #: ``ops.bulk``: cancel, retry, delete or run-now, by ids or by filter, a small batch.
    "bulk": 6,
    #: ``ops.requeue_dead_jobs`` by filter, a small batch.
    "requeue_dead": 2,
    #: 3 to 8 jobs of the ``batched`` batch task (an ``enqueue_many``), most of one payload
    #: key: their workers run them in batches of up to 5 of one key, each job's verdict its
    #: plan's.
    "enqueue_batch": 2,
    #: A job of the ``limited`` task (``hard_timeout``, an ``enqueue``): each attempt runs in a
    #: child process, killed at its limit when its plan overruns it.
    "enqueue_limited": 2,
}
#: The share of ``enqueue`` and ``enqueue_many`` steps made through an Engine (a transaction
#: of the enqueue's own, tried again on a transient error) rather than a Session.
ENGINE_SHARE = 0.25
#: The bulk actions a ``bulk`` step draws from.
BULK_ACTIONS = ("cancel", "retry", "delete", "run_now")
#: How a ``typed`` payload may not fit its type (see ``operations.misfit``).
MISFITS = ("n_text", "k_bool", "extra_key", "no_plan", "plan_text")
#: The operations whose jobs later steps may name (``depends_on``).
ENQUEUES = (
    "enqueue",
    "enqueue_many",
    "enqueue_quick",
    "enqueue_batch",
    "enqueue_limited",
    "chain",
    "group",
    "chord",
)
#: Operations that every client runs at once, each its own part (see :func:`_race_args`).
RACES = ("race_deps", "race_key", "race_cancel")
#: Every fault the checker can inject.
FAULTS = (
    "sigkill",
    "sigstop",
    "terminate",
    "restart",
    "start_worker",
    "stop_worker",
    "blackhole",
    "refuse",
    #: New connections cut right after their handshake, at their first query (the dialect's
    #: setup, or the pool's ping at checkout), with a worker started into them: a variant
    #: of ``refuse``, which closes them before the handshake.
    "cut_setup",
    "bouncer_restart",
    "conn_limit",
)
#: The faults of the CI run: all of them (leave one out here while a known defect of its
#: is being fixed, and say why beside it).
CI_FAULTS = frozenset(FAULTS)
#: The operations of the CI run: all of them (lower a weight to 0 here to leave one out while
#: a known defect of its is being fixed, and say why beside it).
CI_OPERATIONS: Mapping[str, int] = dict(OPERATIONS)

PLANS: tuple[tuple[tuple[str, ...], int], ...] = (
    (("ok",), 40),
    (("slow",), 12),
    (("fail", "ok"), 8),
    (("fail", "fail", "fail"), 4),
    (("retry", "ok"), 6),
    (("discard",), 3),
    (("long",), 3),
    (("hold",), 3),
    (("fail", "slow"), 3),
)
#: The plans of the CI run: all of them.
CI_PLANS = PLANS
#: The plans of the tasks that draw from a mix of their own, whatever ``Config.plans``:
#: the hard-limited task's overrun their limit often (``long`` and ``hold`` are killed at
#: it), and the batch task's mark jobs alone (``fail``, ``retry``, ``discard``) or fail the
#: whole batch (``crash``) often.
TASK_PLANS: Mapping[str, tuple[tuple[tuple[str, ...], int], ...]] = {
    "limited": (
        (("ok",), 6),
        (("slow",), 2),
        (("long", "ok"), 5),
        (("long",), 1),
        (("hold", "ok"), 1),
        (("fail", "ok"), 2),
        (("retry", "ok"), 1),
    ),
    "batched": (
        (("ok",), 12),
        (("fail", "ok"), 3),
        (("retry", "ok"), 2),
        (("discard",), 1),
        (("crash", "ok"), 2),
        (("fail", "fail", "fail"), 1),
        (("slow",), 2),
        (("long",), 1),
        (("hold",), 1),
    ),
}
#: The actions a ``quick`` job's plan is drawn from (the plans made of these alone): none
#: sleeps, so its handler stays under the worker's GROUP_FAST and its jobs are grouped.
QUICK_ACTIONS = frozenset({"ok", "fail", "retry", "discard"})
#: The payload keys (``k``): of the caps and rates per key, and the batch task's batch_key.
KEYS = ("c0", "c1", "c2")
#: The tasks of chains, groups, chords and races.
FLOW_TASKS = ("plain", "kept", "brief", "quick")
UNIQUE_TASKS = ("keyed", "replacing", "periodic_key")
#: The workers' ``--prefetch`` a seed draws from (None: the adaptive buffer, up to 8 x the
#: threads). A small one makes ``worker_bound`` tight: threads + 2.
PREFETCH: tuple[int | None, ...] = (None, 2)
#: The CI run's: both.
CI_PREFETCH: tuple[int | None, ...] = PREFETCH


@dataclass(frozen=True)
class Config:
    """What a seed's schedule is drawn from."""

    steps: int = 100
    #: Client threads playing the steps at once, each on its own connections: a step is
    #: drawn for one client, and a race step is run by every client at the same moment.
    clients: int = 3
    workers: int = 2
    concurrency: int = 3
    faults: frozenset[str] = CI_FAULTS
    operations: Mapping[str, int] = field(default_factory=lambda: dict(CI_OPERATIONS))
    #: What the handlers are told to do, attempt by attempt, with weights.
    plans: tuple[tuple[tuple[str, ...], int], ...] = CI_PLANS
    #: The chance that a step is a fault rather than an operation (when any fault is on).
    fault_rate: float = 0.07
    #: Whether a job with a unique key may have dependencies (the CI run says yes).
    unique_with_deps: bool = True
    #: The longest SIGSTOP, in milliseconds: past the leases (1 to 3 s) often enough that a
    #: worker wakes after its slot of a capped queue went to another job.
    max_stop_ms: int = 2500
    #: The longest pause before a step, in milliseconds (drawn from 0 up to it).
    max_gap_ms: int = 150
    #: Whether burst workers reach the database directly rather than through the seed's
    #: network and its faults (the CI run says no).
    bursts_direct: bool = False
    #: The workers' ``--prefetch``, drawn per seed from these (None: the adaptive buffer).
    prefetch: tuple[int | None, ...] = CI_PREFETCH
    #: How the workers name their queues (keys of ``cluster.SERVINGS``): each seed takes them
    #: in an order of its own, the n-th worker started the n-th (round the list).
    servings: tuple[str, ...] = tuple(SERVINGS)
    #: The chance that a seed's first worker is a supervisor (``--processes 2``): a fifth of
    #: the seeds (of the CI run's fixed ones, 13), as a supervisor's start and stop cost
    #: seconds.
    supervised: float = 0.2

    def networks(self) -> list[str]:
        """How the workers may reach the database: the faults on decide."""
        nets = ["direct"]
        if self.faults & {"blackhole", "refuse", "cut_setup"}:
            nets.append("proxy")
        if "bouncer_restart" in self.faults:
            nets.append("bouncer")
        return nets


@dataclass(frozen=True)
class Step:
    """One operation or fault, after ``gap_ms`` of letting the workers run.

    ``client`` is the client thread that runs it, or :data:`ALL` for a race: every client
    waits for the others, then runs its own part (``args["parts"][client]``) at once.
    """

    index: int
    gap_ms: int
    kind: str
    fault: bool
    args: dict[str, Any]
    client: int = 0

    def describe(self) -> str:
        what = "FAULT" if self.fault else "op"
        who = "all" if self.client == ALL else f"c{self.client}"
        return (
            f"{self.index:4d} {who:>3} +{self.gap_ms:3d}ms {what} {self.kind}"
            f" {json.dumps(self.args)}"
        )

    def part(self, client: int) -> Step:
        """A race's part for ``client``, as a step of its own (same index)."""
        args = self.args["parts"][client]
        return Step(self.index, 0, args["op"], False, args, client)


#: The ``client`` of a step every client runs (a race).
ALL = -1


@dataclass(frozen=True)
class Schedule:
    seed: int
    network: str
    workers: int
    concurrency: int
    steps: list[Step]
    clients: int = 1
    prefetch: int | None = None
    servings: tuple[str, ...] = ("names",)
    supervised: bool = False

    def of(self, client: int) -> list[Step]:
        """The steps ``client`` plays, in order: its own and every race."""
        return [s for s in self.steps if s.client in (client, ALL)]

    def describe(self) -> str:
        head = (
            f"seed {self.seed}: {len(self.steps)} steps, {self.clients} clients,"
            f" {self.workers} workers x {self.concurrency} threads, prefetch"
            f" {'adaptive' if self.prefetch is None else self.prefetch}, network {self.network},"
            f" queues served by {'/'.join(self.servings)}"
            + (", the first worker supervised (--processes 2)" if self.supervised else "")
        )
        return "\n".join([head, *(s.describe() for s in self.steps)])


def generate(seed: int, config: Config) -> Schedule:
    """The schedule of ``seed``: the same seed and config always give the same steps."""
    rng = random.Random(seed)
    network = rng.choice(config.networks())
    prefetch = rng.choice(config.prefetch)
    # The workers' settings from a generator of their own: changing them (--servings,
    # --supervised) leaves the seed's steps as they were.
    workers = random.Random(f"{seed}:workers")
    servings = list(config.servings)
    workers.shuffle(servings)
    supervised = workers.random() < config.supervised
    faults = sorted(f for f in config.faults if _fits(f, network))
    names = [n for n, w in config.operations.items() if w > 0]
    weights = [config.operations[n] for n in names]
    steps: list[Step] = []
    producers: list[tuple[int, int]] = []  # (step, jobs it enqueues): what depends_on may name
    n = 0
    for index in range(config.steps):
        gap = rng.randint(0, config.max_gap_ms)
        client = rng.randrange(config.clients)
        if faults and rng.random() < config.fault_rate:
            kind = rng.choice(faults)
            steps.append(Step(index, gap, kind, True, _fault_args(rng, kind, config), client))
            continue
        kind = rng.choices(names, weights)[0]
        if kind in RACES:
            args = _race_args(rng, kind, producers, n, config)
            n += sum(p.get("count", 0) for p in args["parts"])
            steps.append(Step(index, gap, kind, False, args, ALL))
            continue
        args = _op_args(rng, kind, producers, n, config)
        n += args.get("count", 1)
        if kind in ENQUEUES:
            producers.append((index, args.get("count", 1)))
        steps.append(Step(index, gap, kind, False, args, client))
    return Schedule(
        seed,
        network,
        config.workers,
        config.concurrency,
        steps,
        config.clients,
        prefetch,
        tuple(servings),
        supervised,
    )


def _fits(fault: str, network: str) -> bool:
    if fault in ("blackhole", "refuse", "cut_setup"):
        return network == "proxy"
    if fault == "bouncer_restart":
        return network == "bouncer"
    if fault == "conn_limit":  # PgBouncer's auth file knows the server's user only
        return network != "bouncer"
    return True


def _fault_args(rng: random.Random, kind: str, config: Config) -> dict[str, Any]:
    if kind == "sigstop":
        return {"pick": rng.randrange(1000), "ms": rng.randint(200, config.max_stop_ms)}
    if kind == "refuse":
        return {"ms": rng.randint(300, 2500)}
    if kind == "cut_setup":
        return {"count": rng.randint(1, 3), "ms": rng.randint(300, 2500)}
    if kind == "conn_limit":
        return {"pick": rng.randrange(1000), "ms": rng.randint(300, 2500)}
    if kind in ("sigkill", "restart", "stop_worker"):
        return {"pick": rng.randrange(1000)}
    return {}


def _plan(rng: random.Random, mix: tuple[tuple[tuple[str, ...], int], ...]) -> list[str]:
    plans, weights = zip(*mix, strict=True)
    return list(rng.choices(plans, weights)[0])


def _job(rng: random.Random, n: int, task: str, config: Config) -> dict[str, Any]:
    """A payload: its number, its plan, a key for caps per key, and a unique key maybe.

    A ``quick`` job's plan is one of the mix's fast plans (only QUICK_ACTIONS), or ``ok``; a
    task of TASK_PLANS draws from its own mix.
    """
    mix = TASK_PLANS.get(task, config.plans)
    if task in LATE:
        mix = tuple((p, w) for p, w in mix if QUICK_ACTIONS.issuperset(p)) or ((("ok",), 1),)
    plan = _plan(rng, mix)
    payload: dict[str, Any] = {"n": n, "plan": plan, "k": rng.choice(KEYS)}
    if task in UNIQUE_TASKS:
        payload["uk"] = f"u{rng.randrange(4)}"
    return payload


def _options(rng: random.Random) -> dict[str, Any]:
    """Enqueue options, each present or not; durations in milliseconds."""
    options: dict[str, Any] = {}
    if rng.random() < 0.5:
        options["queue"] = rng.choice(QUEUES)
    if rng.random() < 0.3:
        options["priority"] = rng.choice([-5, 0, 3, 10])
    if rng.random() < 0.2:
        options["run_at_ms"] = rng.randint(50, 1500)
    if rng.random() < 0.1:
        options["max_attempts"] = rng.randint(1, 4)
    if rng.random() < 0.1:
        options["lease_ms"] = rng.choice([1000, 3000])
    return options


def _deps(rng: random.Random, producers: list[tuple[int, int]]) -> list[dict[str, Any]]:
    if not producers or rng.random() > 0.3:
        return []
    chosen = rng.sample(producers[-12:], k=min(len(producers[-12:]), rng.randint(1, 2)))
    return [
        {"step": step, "pos": rng.randrange(count), "on_failure": rng.choice(["cancel", "run"])}
        for step, count in chosen
    ]


def _race_args(
    rng: random.Random, kind: str, producers: list[tuple[int, int]], n: int, config: Config
) -> dict[str, Any]:
    """Every client's part of a race, drawn here so that the race replays.

    - ``race_deps``: each client enqueues a job depending on the same 2 to 4 earlier jobs,
      named in an order of its own (enqueues that lock shared rows in different orders).
    - ``race_key``: each client enqueues the same unique key of one task, each with a mode
      of its own (skip, replace, debounce).
    - ``race_cancel``: client 0 cancels an earlier job while the others enqueue jobs that
      depend on it.
    """
    refs = [{"step": s, "pos": rng.randrange(c)} for s, c in producers[-8:]]
    parts: list[dict[str, Any]] = []
    if kind == "race_deps":
        shared = rng.sample(refs[-6:], k=min(len(refs[-6:]), rng.randint(3, 4)))
        for ref in shared:
            ref["on_failure"] = rng.choice(["cancel", "run"])
        for c in range(config.clients):
            order = list(shared)
            rng.shuffle(order)
            task = rng.choice(FLOW_TASKS)
            parts.append(
                {
                    "op": "enqueue",
                    "task": task,
                    "payload": _job(rng, n + c, task, config),
                    "depends_on": order,
                    "count": 1,
                }
            )
    elif kind == "race_key":
        task = rng.choice(UNIQUE_TASKS)
        uk = f"u{rng.randrange(4)}"
        for c in range(config.clients):
            payload = _job(rng, n + c, task, config)
            payload["uk"] = uk
            part = {"op": "enqueue", "task": task, "payload": payload, "depends_on": [], "count": 1}
            if rng.random() < 0.7:
                part["unique_mode"] = rng.choice(["skip", "replace", "debounce"])
            parts.append(part)
    else:
        target = rng.choice(refs) if refs else None
        parts.append({"op": "cancel", "ref": target, "pick": rng.randrange(1000), "count": 0})
        for c in range(1, config.clients):
            task = rng.choice(FLOW_TASKS)
            dep = (
                [] if target is None else [{**target, "on_failure": rng.choice(["cancel", "run"])}]
            )
            parts.append(
                {
                    "op": "enqueue",
                    "task": task,
                    "payload": _job(rng, n + c, task, config),
                    "depends_on": dep,
                    "count": 1,
                }
            )
    return {"parts": parts}


def _bulk_args(rng: random.Random, action: str, by_ids: bool = True) -> dict[str, Any]:
    """A bulk action's selection: 1 to 5 of the recent jobs (``pick``), or filters."""
    args: dict[str, Any] = {"action": action, "batch": rng.choice([1, 2, 5, 10])}
    if by_ids and rng.random() < 0.5:
        args["picks"] = [rng.randrange(1000) for _ in range(rng.randint(1, 5))]
        return args
    if rng.random() < 0.6:
        args["queue"] = rng.choice(QUEUES)
    if rng.random() < 0.4:
        args["task"] = rng.choice(TASKS)
    if rng.random() < 0.3:
        args["older_than_ms"] = rng.choice([500, 2000])
    if action != "requeue_dead" and rng.random() < 0.3:
        args["statuses"] = sorted(rng.sample(STATUSES, k=rng.randint(1, 3)))
    return args


def _op_args(
    rng: random.Random, kind: str, producers: list[tuple[int, int]], n: int, config: Config
) -> dict[str, Any]:
    if kind in ("enqueue", "enqueue_limited"):
        task = "limited" if kind == "enqueue_limited" else rng.choice(TASKS)
        args: dict[str, Any] = {
            "task": task,
            "payload": _job(rng, n, task, config),
            **_options(rng),
        }
        if task in UNIQUE_TASKS and rng.random() < 0.3:
            args["unique_mode"] = rng.choice(["skip", "replace", "debounce"])
        if task == "plain" and rng.random() < 0.15:
            args["unique_key"] = f"p{rng.randrange(3)}"
            if rng.random() < 0.3:
                args["unique_period_s"] = 2
        keyed = task in UNIQUE_TASKS or "unique_key" in args
        args["depends_on"] = [] if keyed and not config.unique_with_deps else _deps(rng, producers)
        if rng.random() < ENGINE_SHARE:
            args["via"] = "engine"
        return args
    if kind in ("enqueue_many", "enqueue_quick", "enqueue_batch"):
        if kind == "enqueue_quick":
            task, count = "quick", rng.randint(3, 8)
        elif kind == "enqueue_batch":
            task, count = "batched", rng.randint(3, 8)
        else:
            task, count = rng.choice(TASKS), rng.randint(2, 6)
        payloads = [_job(rng, n + i, task, config) for i in range(count)]
        if kind == "enqueue_batch":  # most of one key, so that batches fill
            key = rng.choice(KEYS)
            for payload in payloads:
                payload["k"] = key if rng.random() < 0.8 else rng.choice(KEYS)
        args = {
            "task": task,
            "payloads": payloads,
            "count": count,
            "depends_on": []
            if task in UNIQUE_TASKS and not config.unique_with_deps
            else _deps(rng, producers),
            **_options(rng),
        }
        if kind in ("enqueue_many", "enqueue_batch") and rng.random() < ENGINE_SHARE:
            args["via"] = "engine"
        return args
    if kind == "enqueue_typed":
        # "invalid": refused at enqueue, nothing written; "misfit": committed, then failed
        # by the worker. The count is 1 either way: the job's number is used up.
        return {
            "variant": rng.choice(["invalid", "misfit"]),
            "misfit": rng.choice(MISFITS),
            "payload": _job(rng, n, "typed", config),
            "via": "engine" if rng.random() < ENGINE_SHARE else "session",
        }
    if kind == "bulk":
        return _bulk_args(rng, rng.choice(BULK_ACTIONS))
    if kind == "requeue_dead":
        return _bulk_args(rng, "requeue_dead", by_ids=False)
    if kind in ("chain", "group", "chord"):
        count = rng.randint(2, 4)
        calls = []
        for i in range(count):
            task = rng.choice(FLOW_TASKS)
            calls.append({"task": task, "payload": _job(rng, n + i, task, config)})
        args = {"calls": calls, "count": count}
        if kind != "group":
            args["on_failure"] = rng.choice(["cancel", "run"])
        return args
    if kind in ("cancel", "requeue", "wait_result"):
        return {"pick": rng.randrange(1000)}
    if kind == "burst":
        # Names and patterns: a burst of a pattern claims as a worker serving by pattern does.
        return {"queues": sorted(rng.sample(QUEUES + PATTERNS, k=rng.randint(1, 4)))}
    if kind in ("pause", "resume", "clear_limits"):
        return {"queue": rng.choice(QUEUES)}
    if kind == "set_cap":
        return {"queue": rng.choice(QUEUES), "cap": rng.choice([None, 1, 2, 3])}
    if kind == "set_key_cap":
        return {"queue": rng.choice(QUEUES), "cap": rng.choice([None, 1, 2])}
    if kind == "set_key_rate":
        return {"queue": rng.choice(QUEUES), "rate": rng.choice([None, "2/s", "1/0.5s", "4/2s"])}
    if kind == "set_rate":
        return {"queue": rng.choice(QUEUES), "rate": rng.choice([None, "5/s", "3/0.5s", "20/2s"])}
    raise ValueError(f"unknown operation {kind}")
