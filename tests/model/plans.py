"""Invariants of what each attempt's planned action leads to: for every task, for the
hard-limited task (``tasks.LIMITED``), and for the batch task (``tasks.BATCHES``).

- ``plans_followed``: a succeeded job's last attempt had an action that returns (``ok``,
  ``slow``, ``long``, ``hold``); never one that raises, is given its own verdict in a batch
  (``fail``, ``retry``, ``discard``), or fails its whole batch (``crash``); and, for a
  hard-limited task, never one that overruns the limit (``long`` sleeps 3 s and ``hold``
  waits 3 s, against a limit of 1 s): such an attempt is killed, so cannot succeed.
- ``hard_limit``: no attempt of a hard-limited task whose action overruns the limit ever
  ended (its end is audited after the sleep: the child lived 3 s, past the limit and the
  child's own deadline, the limit plus ``SELF_KILL_MARGIN``); and one that started, wrote its
  effect (no error audited) and ended is recorded as failed with ``HardTimeoutError``, never
  handed back (``released``: the child's handler never sees its worker's shutdown, so a kill
  at the limit during one is still a failure); its effect's rollback is ``effects_once``'s.
- ``batch_form``: each batch the handler ran (the audit's ``mc_starts.batch``) holds at most
  its task's ``max_size`` jobs, each once, all of one queue and one value of the
  ``batch_key`` field (``k``).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from tests.model.history import history
from tests.model.model import Model, Violation
from tests.model.tasks import BATCHES, HARD_LIMIT, LIMITED, action_of

#: The actions after which an attempt's handler returns.
RETURNS = frozenset({"ok", "slow", "long", "hold"})
#: The actions that outlast a hard limit of HARD_LIMIT: a hard-limited attempt that draws one
#: is killed at the limit.
OVERRUNS = frozenset({"long", "hold"})
HARD_TIMEOUT = "sa_jobqueue.errors.HardTimeoutError"
#: The history outcomes of a failed attempt, and of one handed back.
FAILED = ("retried", "dead")
RELEASED = "released"


def _plan(row: Any) -> list[str] | None:
    plan = row.payload.get("plan") if isinstance(row.payload, dict) else None
    if isinstance(plan, list) and plan and all(isinstance(a, str) for a in plan):
        return plan
    return None


def plans_followed(model: Model, final: Any) -> list[Violation]:
    """``plans_followed``: see the module's docstring."""
    found = []
    for i, record in model.jobs.items():
        row = final.jobs.get(i)
        if row is None or row.status != "succeeded" or (plan := _plan(row)) is None:
            continue
        action = action_of(plan, row.attempts)
        allowed = RETURNS - OVERRUNS if record.task in LIMITED else RETURNS
        if action not in allowed:
            limited = record.task in LIMITED
            limit = f" (hard limit {HARD_LIMIT.total_seconds():g}s)" if limited else ""
            found.append(
                Violation(
                    "plans_followed",
                    (i,),
                    f"{record.task}{limit} succeeded at attempt {row.attempts}, whose planned"
                    f" action is {action!r} (plan {plan})",
                )
            )
    return found


def hard_limits(model: Model, final: Any) -> list[Violation]:
    """``hard_limit``: see the module's docstring."""
    found = []
    for i, record in model.jobs.items():
        row = final.jobs.get(i)
        if row is None or record.task not in LIMITED or (plan := _plan(row)) is None:
            continue
        began = {s.attempt: s for s in final.starts.get(i, [])}
        for attempt, start in began.items():
            if action_of(plan, attempt) not in OVERRUNS:
                continue
            ended = final.ends.get((i, attempt), [])
            if any(e.error is None for e in ended):
                found.append(
                    Violation(
                        "hard_limit",
                        (i,),
                        f"attempt {attempt} ({action_of(plan, attempt)}) started at {start.at} and"
                        f" ended at {ended[0].at}, past its hard limit of"
                        f" {HARD_LIMIT.total_seconds():g}s",
                    )
                )
            if ended:
                continue  # its session failed first: not an overrun
            for entry in history(row):
                outcome = entry.get("outcome")
                if entry.get("attempt") != attempt or outcome not in (*FAILED, RELEASED):
                    continue
                error = entry.get("error")
                kind = error.get("type") if isinstance(error, dict) else None
                if outcome == RELEASED or kind != HARD_TIMEOUT:
                    found.append(
                        Violation(
                            "hard_limit",
                            (i,),
                            f"attempt {attempt} ({action_of(plan, attempt)}) overran its hard"
                            f" limit, yet its failure ({entry.get('outcome')}) says {error}",
                        )
                    )
    return found


def batch_form(model: Model, final: Any) -> list[Violation]:
    """``batch_form``: see the module's docstring."""
    batches: dict[str, list[Any]] = defaultdict(list)
    for began in final.starts.values():
        for s in began:
            if s.batch is not None:
                batches[s.batch].append(s)
    found = []
    for batch, members in batches.items():
        task = members[0].task
        bad = []
        if len(members) > BATCHES.get(task, 0):
            bad.append(f"{len(members)} jobs, over its max_size of {BATCHES.get(task)}")
        if len({s.job_id for s in members}) != len(members):
            bad.append("a job twice")
        if len({(s.task, s.queue, s.key) for s in members}) != 1:
            bad.append("jobs of several tasks, queues or keys")
        if bad:
            shown = [(s.job_id, s.attempt, s.task, s.queue, s.key) for s in members]
            found.append(
                Violation(
                    "batch_form",
                    tuple(sorted({s.job_id for s in members})),
                    f"batch {batch}: " + "; ".join(bad) + f": {shown}",
                )
            )
    model.checked["batches"] = model.checked.get("batches", 0) + len(batches)
    return found
