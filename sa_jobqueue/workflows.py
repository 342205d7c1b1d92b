"""Workflows: jobs that wait for other jobs.

A job enqueued with ``depends_on`` waits (status ``waiting``, outside the claim) until every
job it names has ended, then runs. What a dependency that ends ``dead`` or ``cancelled`` does
to it is the edge's choice: :class:`Dependency` ``(job_id, on_failure="cancel")`` (the
default) cancels it, and in turn what waits for it; ``on_failure="run"`` runs it as if the
dependency had succeeded. A plain id is a dependency with the default::

    with Session(engine) as session, session.begin():
        fetch = queue.enqueue(session, "fetch", {"url": url})
        parse = queue.enqueue(session, "parse", {"url": url}, depends_on=[fetch])
        queue.enqueue(session, "notify", {}, depends_on=[Dependency(parse, on_failure="run")])

The edges are settled in the statement that ends each dependency (its fenced completion, its
failure, its cancellation), in that statement's transaction: exactly once, and only by the
attempt that ended it. A dependency may be any job that exists, committed or enqueued earlier
in the same transaction; a job can only depend on jobs that exist before it, so no cycle can
be built. An id with no job raises :class:`~sa_jobqueue.errors.UnknownJobError` before the job
is inserted.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal

from sqlalchemy import Connection

from ._enqueue.options import OPTION_NAMES
from ._sql import dependencies as dependencies_sql
from .errors import InvalidJobError, UnknownJobError
from .models import CANCELLED, DEAD, FINISHED_STATUSES, WAITING

if TYPE_CHECKING:
    from ._enqueue import Enqueued
    from .tasks import Task

__all__ = ["Call", "Dependency", "OnFailure"]

#: What a dependency that ends dead or cancelled does to the job that waits for it.
OnFailure = Literal["cancel", "run"]
_POLICIES: Final = ("cancel", "run")
#: The most dependencies one job may have.
MAX_DEPENDENCIES: Final = 100_000


@dataclass(frozen=True)
class Dependency:
    """An edge: wait for job ``job_id``; if it ends dead or cancelled, ``on_failure`` says
    whether the waiting job is cancelled (``"cancel"``) or runs anyway (``"run"``)."""

    job_id: int
    on_failure: OnFailure = "cancel"

    def __post_init__(self) -> None:
        if isinstance(self.job_id, bool) or not isinstance(self.job_id, int):
            raise InvalidJobError(f"a dependency is a job id (an int), not {self.job_id!r}")
        object.__setattr__(self, "job_id", int(self.job_id))  # an Enqueued is an int too
        if self.on_failure not in _POLICIES:
            raise InvalidJobError(f"on_failure is 'cancel' or 'run', not {self.on_failure!r}")


@dataclass(frozen=True)
class Call:
    """One job of a chain, a group or a chord: its task, its payload, and enqueue options
    (those of :class:`~sa_jobqueue.queue.JobOptions` but the unique ones: ``run_at``,
    ``priority``, ``queue``, ``max_attempts``, ``lease``, ``backoff``)::

        queue.chain(session, [Call("fetch", {"url": url}), Call("parse"), Call("store")])
    """

    task: str | Task
    payload: Any = None
    options: Mapping[str, Any] = field(default_factory=dict)


def check_dependencies(depends_on: Sequence[int | Dependency] | None) -> list[Dependency]:
    """``depends_on`` as Dependency edges, each job once; InvalidJobError before any SQL."""
    if depends_on is None:
        return []
    if isinstance(depends_on, (str, bytes, int)) or not isinstance(depends_on, Sequence):
        raise InvalidJobError(f"depends_on is a list of job ids, not {depends_on!r}"[:200])
    edges = [d if isinstance(d, Dependency) else Dependency(d) for d in depends_on]
    if len({d.job_id for d in edges}) != len(edges):
        raise InvalidJobError("depends_on names a job twice")
    if len(edges) > MAX_DEPENDENCIES:
        raise InvalidJobError(f"at most {MAX_DEPENDENCIES} dependencies, not {len(edges)}")
    return edges


def lock_dependencies(conn: Connection, edges: list[Dependency]) -> dict[int, str]:
    """The status of each dependency, each kept from deletion until the caller's transaction
    ends; UnknownJobError (before anything is inserted) for an id with no job."""
    ids = [d.job_id for d in edges]
    rows = conn.execute(dependencies_sql.lock_dependencies(), {"depends_on": ids}).all()
    found: dict[int, str] = {job_id: status for job_id, status in rows}
    missing = [i for i in ids if i not in found]
    if missing:
        raise UnknownJobError(missing)
    return found


def add_dependencies(
    conn: Connection,
    job_ids: Sequence[int],
    edges: list[Dependency],
    found: dict[int, str],
    new: frozenset[int] = frozenset(),
) -> None:
    """Make the new jobs ``job_ids`` wait for ``edges`` (statuses ``found`` as locked): the
    edges, and each job moved to ``waiting`` while any of them is pending, or ``cancelled`` at
    once when one ended dead or cancelled on an edge that cancels. ``new``: dependencies
    enqueued in this transaction (no one else can end them before it commits: their edges
    need no second look at commit)."""
    pending = [found[d.job_id] not in FINISHED_STATUSES for d in edges]
    failed = [
        d.job_id for d in edges if found[d.job_id] in (DEAD, CANCELLED) and d.on_failure == "cancel"
    ]
    params = {
        "job_ids": list(job_ids),
        "depends_on": [d.job_id for d in edges],
        "on_failure": [d.on_failure for d in edges],
        "pending": pending,
        "recheck": [p and d.job_id not in new for p, d in zip(pending, edges, strict=True)],
    }
    conn.execute(dependencies_sql.add_edges(), params)
    if failed:
        error = {
            "type": "DependencyFailed",
            "message": "a job it depends on ended dead or cancelled: "
            + ", ".join(map(str, failed)),
        }
        status, text = CANCELLED, json.dumps(error)
    elif any(pending):
        status, text = WAITING, None
    else:
        return  # every dependency has succeeded (or may fail): it runs as enqueued
    params = {"job_ids": list(job_ids), "b_status": status, "b_error": text}
    conn.execute(dependencies_sql.hold_back(), params)


def enqueue_with(
    conn: Connection,
    edges: list[Dependency],
    insert: Callable[[], list[Enqueued]],
    new: frozenset[int] = frozenset(),
) -> list[Enqueued]:
    """Run ``insert`` (an enqueue on ``conn``) with ``edges``: the dependencies locked first (an
    unknown one raises before anything is inserted), then given to the jobs it created (a
    unique key's live job, already there, is left as it is)."""
    if not edges:
        return insert()
    found = lock_dependencies(conn, edges)
    ids = insert()
    created = [job_id for job_id in ids if job_id.created]
    if created:
        add_dependencies(conn, created, edges, found, new)
    return ids


#: The enqueue options a :class:`Call` may carry: those of
#: :class:`~sa_jobqueue.queue.JobOptions` but the unique ones (a call takes no unique key of
#: its own; a key its task derives is held as the task declares).
CALL_OPTIONS: Final = OPTION_NAMES - {"unique_mode", "unique_period"}


def check_call_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """A Call's options, the ones given (None: left to the task); InvalidJobError for others."""
    unknown = sorted(set(options) - CALL_OPTIONS)
    if unknown:
        raise InvalidJobError(
            f"a Call takes the options {', '.join(sorted(CALL_OPTIONS))}, not {', '.join(unknown)}"
        )
    return {name: value for name, value in options.items() if value is not None}
