"""The hot path's statements, compiled for PostgreSQL, must match the committed golden files.

The claim, the completions and the lease renewals are the statements every job goes through;
a change to any of them, intended or not, must show in review as a change to a file under
``tests/unit/golden/``. No database is needed: each builder is compiled with SQLAlchemy's
psycopg dialect, as the worker's engine compiles it.

After an intended change, regenerate the files and review their diff::

    SA_JOBQUEUE_UPDATE_GOLDEN=1 pytest tests/unit/test_sql_golden.py
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
from sqlalchemy.dialects.postgresql import psycopg
from sqlalchemy.sql import ClauseElement

from sa_jobqueue._sql import (
    claim_limits,
    claim_many,
    claiming,
    copying,
    enqueue,
    leases,
    transitions,
    unique_holders,
)

GOLDEN = Path(__file__).parent / "golden"
UPDATE_ENV = "SA_JOBQUEUE_UPDATE_GOLDEN"

BUILDERS: dict[str, Callable[[], ClauseElement]] = {
    "claim": claiming.claim,
    "claim_after": claiming.claim_after,
    # The claim over many queues: the queues with due jobs, round-robin, in one statement.
    "claim_many": claim_many.claim_many,
    # The limited claim's four variants: with or without a limit per key, alone or completing
    # the jobs that freed their slots in the same statement (the worker's HandOff).
    "claim_limited": partial(claim_limits.claim_limited, keyed=False),
    "claim_limited_keyed": partial(claim_limits.claim_limited, keyed=True),
    "claim_limited_completing": partial(claim_limits.claim_limited, keyed=False, completing=True),
    "claim_limited_keyed_completing": partial(
        claim_limits.claim_limited, keyed=True, completing=True
    ),
    # The claim that fills a batch task's batch: the limited claim, restricted to one batch.
    "claim_limited_batch": partial(claim_limits.claim_limited, keyed=False, batch=True),
    "complete": transitions.complete,
    "complete_many": transitions.complete_many,
    "fail": transitions.fail,
    "snooze": transitions.snooze,
    "bury": transitions.bury,
    "release": transitions.release,
    "finish_cancelled": transitions.finish_cancelled,
    "extend_leases": leases.extend_leases,
    "still_held": leases.still_held,
    # Enqueue's: one job (due now, waking its queue), a batch by INSERT, a batch's ids for COPY.
    "insert_job": partial(enqueue.insert_job, "now", True),
    "insert_jobs": partial(enqueue.insert_jobs, "now", wake=True),
    "reserve_jobs": partial(copying.reserve_jobs, "now", True),
    # A replace's guarded UPDATE of the queued job holding a key, for one job and for a batch:
    # the status guard is what keeps it off a claimed job.
    "update_held": partial(unique_holders.update_held, "replace", "now"),
    "update_held_many": partial(unique_holders.update_held, "debounce", "after", many=True),
}

# Line breaks go before these words, so that a change shows as a changed line in a diff rather
# than as one changed line of two thousand characters. Only whitespace changes: lines are
# broken, stripped, and blank ones dropped.
_BREAK_BEFORE = re.compile(
    r"\s+(?=(?:FROM|WHERE|SET|RETURNING|ORDER BY|GROUP BY|LIMIT|WHEN|ELSE|SELECT|UPDATE) )"
    r"(?<!FOR )"
)


def render(name: str, builder: Callable[[], ClauseElement]) -> str:
    """The golden text of one statement: its SQL, then the parameters it binds itself."""
    compiled = builder().compile(dialect=psycopg.dialect())
    sql = _BREAK_BEFORE.sub("\n", str(compiled))
    lines = [line.strip() for line in sql.splitlines() if line.strip()]
    supplied = sorted(key for key, bind in compiled.binds.items() if bind.required)
    # Constants (statuses, error texts, increments) are bound, not spliced into the text, so
    # the text alone would not show a change from 'running' to 'queued'.
    constants = [
        f"--   {key} = {value!r}"
        for key, value in sorted(compiled.params.items())
        if key not in supplied
    ]
    if isinstance(builder, partial):
        given = [repr(a) for a in builder.args]
        given += [f"{key}={value!r}" for key, value in builder.keywords.items()]
        call = f"{builder.func.__module__}.{builder.func.__name__}({', '.join(given)})"
    else:
        call = f"{builder.__module__}.{builder.__name__}()"
    return "\n".join(
        [
            f"-- {call}, compiled for PostgreSQL (psycopg)",
            f"-- regenerate: {UPDATE_ENV}=1 pytest tests/unit/test_sql_golden.py",
            *lines,
            ";",
            f"-- parameters the caller supplies: {', '.join(supplied) or 'none'}",
            "-- constants the statement binds:" if constants else "-- constants: none",
            *constants,
            "",
        ]
    )


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_compiled_sql_matches_the_golden_file(name: str) -> None:
    actual = render(name, BUILDERS[name])
    path = GOLDEN / f"{name}.sql"
    if os.environ.get(UPDATE_ENV) == "1":
        path.write_text(actual, encoding="utf-8")
        return
    assert path.exists(), f"{path} is missing: run with {UPDATE_ENV}=1 to write it, then review"
    expected = path.read_text(encoding="utf-8")
    if actual != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                actual.splitlines(keepends=True),
                fromfile=f"golden/{name}.sql (committed)",
                tofile=f"{name} (compiled now)",
            )
        )
        pytest.fail(
            f"the SQL of {name} changed; if that is intended, regenerate with"
            f" {UPDATE_ENV}=1 and commit the reviewed file:\n{diff}",
            pytrace=False,
        )
