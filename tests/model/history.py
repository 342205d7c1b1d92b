"""The ``attempt_history`` invariant: each job's record of its attempts, against its end.

Every fenced statement that ends a running attempt other than by success appends an entry
(``attempt``, ``at``, ``worker``, ``duration``, ``outcome``, ``error``); a claim that takes
back a job whose lease expired appends ``lease_expired`` for the attempt it lost; a success
adds nothing (``sa_jobqueue/_sql/attempt_history.py``). So, at quiescence, for each job the
checker created (the model's requeues keep attempt numbers rising: ``attempts="extend"``):

- the entries' attempts rise strictly, from 1, none above the job's ``attempts``, and at
  most ``ATTEMPT_HISTORY_LIMIT`` are kept;
- every attempt before the last has its entry (when none was dropped for the bound): each
  ended, and not by success;
- an entry before the last says ``retried``, ``snoozed``, ``released`` or
  ``lease_expired`` (``dead`` too for a job requeued after it); ``cancelled`` only last;
- the last attempt's entry matches the job's end: none for a succeeded job (an entry there
  is a stale attempt's failure recorded over the success), ``dead`` or ``lease_expired``
  for a dead one, with its error as ``last_error``; a cancelled job that ever ran has an
  entry for its last attempt;
- an entry comes from its own attempt: its ``worker`` is the process the audit saw start
  that attempt (when the audit saw it), never one of another attempt.
"""

from __future__ import annotations

import itertools
from typing import Any

from sa_jobqueue.models import ATTEMPT_HISTORY_LIMIT
from tests.model.model import Model, Violation
from tests.model.tasks import LATE

GOES_ON = {"retried", "snoozed", "released", "lease_expired"}
OUTCOMES = GOES_ON | {"dead", "cancelled"}


def _pid(worker: Any) -> int | None:
    """The pid in a worker's default name, ``host:pid:suffix``."""
    parts = str(worker).split(":")
    return int(parts[-2]) if len(parts) >= 3 and parts[-2].isdigit() else None


def history(row: Any) -> list[Any]:
    entries = row.attempt_history
    return entries if isinstance(entries, list) else []


def _problems(record: Any, row: Any, starts: list[Any]) -> list[str]:
    history = row.attempt_history
    if history is None:
        history = []
    if not isinstance(history, list):
        return [f"attempt_history is {type(history).__name__}, not an array"]
    bad = []
    if len(history) > ATTEMPT_HISTORY_LIMIT:
        bad.append(f"{len(history)} entries, over the bound of {ATTEMPT_HISTORY_LIMIT}")
    numbers = [e.get("attempt") for e in history]
    if any(not isinstance(a, int) for a in numbers):
        return [*bad, f"entries without an attempt number: {numbers}"]
    if any(b <= a for a, b in itertools.pairwise(numbers)) or any(
        a < 1 or a > row.attempts for a in numbers
    ):
        bad.append(f"attempts {numbers} do not rise strictly within 1..{row.attempts}")
    whole = len(history) < ATTEMPT_HISTORY_LIMIT
    first = 1 if whole else (numbers[0] if numbers else row.attempts)
    missing = sorted(set(range(first, row.attempts)) - set(numbers))
    if missing:
        bad.append(f"no entry for attempts {missing} (of {row.attempts})")
    last = history[-1] if history else None
    for e in history:
        outcome = e.get("outcome")
        if outcome not in OUTCOMES:
            bad.append(f"attempt {e['attempt']}: outcome {outcome!r}")
        elif e is not last and outcome == "cancelled":
            bad.append(f"attempt {e['attempt']} cancelled, yet more entries follow")
        elif e is not last and outcome == "dead" and record.requeued == 0:
            bad.append(f"attempt {e['attempt']} dead, never requeued, yet more entries follow")
    on_last = last is not None and last["attempt"] == row.attempts
    if row.status == "succeeded" and on_last:
        bad.append(f"succeeded, yet its last attempt's entry says {last}")
    elif row.status == "dead":
        if not on_last or last["outcome"] not in ("dead", "lease_expired"):
            bad.append(f"dead at attempt {row.attempts}, yet the last entry is {last}")
        elif last.get("error") != row.last_error:
            bad.append(f"dead; last_error {row.last_error} is not its entry's {last}")
    elif row.status == "cancelled" and row.attempts > 0 and not on_last:
        bad.append(f"cancelled after attempt {row.attempts}, which has no entry: {last}")
    if record.task not in LATE:
        ran: dict[int, set[int]] = {}
        for s in starts:
            ran.setdefault(s.attempt, set()).add(s.pid)
        for e in history:
            pid = _pid(e.get("worker"))
            if pid is not None and e["attempt"] in ran and pid not in ran[e["attempt"]]:
                bad.append(
                    f"attempt {e['attempt']}'s entry ({e['outcome']}) is by pid {pid}, yet"
                    f" the audit saw the attempt start in {sorted(ran[e['attempt']])}"
                )
    return bad


def attempt_history(model: Model, final: Any) -> list[Violation]:
    """``attempt_history``: see the module's docstring."""
    found = []
    for i, record in model.jobs.items():
        row = final.jobs.get(i)
        if row is None:
            continue
        bad = _problems(record, row, final.starts.get(i, []))
        if bad:
            shown = [(e.get("attempt"), e.get("outcome"), e.get("worker")) for e in history(row)]
            found.append(
                Violation(
                    "attempt_history",
                    (i,),
                    f"{row.status} at attempt {row.attempts}/{row.max_attempts}: "
                    + "; ".join(bad)
                    + f"\n    history {shown}",
                )
            )
    return found
