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

from ._binds import SessionLike
from ._enqueue.options import OPTION_NAMES
from ._sql import dependencies as dependencies_sql
from .errors import InvalidJobError, InvalidWorkflowError, UnknownJobError
from .models import CANCELLED, DEAD, FINISHED_STATUSES, WAITING
from .ops import workflows as workflow_ops
from .ops.filters import RequeueAttempts
from .ops.workflows import WorkflowChange, WorkflowInfo

if TYPE_CHECKING:
    from ._enqueue import Enqueued
    from .tasks import Task

__all__ = ["Call", "Dag", "Dependency", "OnFailure", "Step", "Workflow"]

#: The step name of a workflow's error callback job (``on_error=``), which no step may take.
ERROR_STEP: Final = "on_error"
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


# -- workflows as objects: the handle, and the builder of a DAG of named steps --------------

#: The longest name a step may have (a task name's bound).
MAX_STEP_NAME: Final = 200


class Workflow(Sequence["Enqueued"]):
    """A workflow: the jobs one chain, group, chord or DAG created, each carrying its ``id``.

    What :meth:`JobQueue.chain <sa_jobqueue.JobQueue.chain>`, ``group``, ``chord``,
    ``workflow`` and ``add_steps`` return. It is a sequence of the ids of the jobs the call
    created, in enqueue order (a chain's steps in order; a chord's members, then its
    callback, last), so ``a, b = queue.chain(...)`` unpacks as before; ``steps`` maps a DAG's
    step names to their ids. ``Workflow(workflow_id)`` makes a handle from an id alone (one
    read from the CLI or the dashboard, say): its methods need nothing else.

    The methods run in the caller's transaction, as :mod:`sa_jobqueue.ops` does, and never
    commit: :meth:`read`, :meth:`cancel`, :meth:`retry` and :meth:`delete` (see
    :mod:`sa_jobqueue.ops.workflows` for what each promises, and does not). Not promised:
    that the handle's ids are still jobs of it (a step whose unique key another job held is
    that job, outside the workflow, as ``enqueue`` returns it; pruning deletes finished jobs).
    """

    __slots__ = ("id", "jobs", "steps")

    def __init__(
        self,
        id: int,
        jobs: Sequence[Enqueued] = (),
        steps: Mapping[str, Enqueued] | None = None,
    ) -> None:
        self.id: Final = int(id)
        self.jobs: Final[tuple[Enqueued, ...]] = tuple(jobs)
        self.steps: Final[Mapping[str, Enqueued]] = dict(steps or {})

    def __getitem__(self, index: Any) -> Any:
        return self.jobs[index]

    def __len__(self) -> int:
        return len(self.jobs)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Workflow):
            return NotImplemented
        return (self.id, self.jobs, dict(self.steps)) == (other.id, other.jobs, dict(other.steps))

    def __hash__(self) -> int:
        return hash((self.id, self.jobs))

    def __repr__(self) -> str:
        return f"Workflow(id={self.id}, jobs={list(self.jobs)!r})"

    def read(self, session: SessionLike) -> WorkflowInfo:
        """Its jobs and their edges, as the caller's transaction sees them
        (:func:`~sa_jobqueue.ops.get_workflow`)."""
        return workflow_ops.get_workflow(session, self.id)

    def cancel(self, session: SessionLike) -> WorkflowChange:
        """Cancel every unfinished job of it (:func:`~sa_jobqueue.ops.cancel_workflow`)."""
        return workflow_ops.cancel_workflow(session, self.id)

    def retry(
        self, session: SessionLike, *, attempts: RequeueAttempts = "extend"
    ) -> WorkflowChange:
        """Bring back its dead and cancelled jobs, and what waited on them
        (:func:`~sa_jobqueue.ops.retry_workflow`)."""
        return workflow_ops.retry_workflow(session, self.id, attempts=attempts)

    def delete(self, session: SessionLike, *, force: bool = False) -> WorkflowChange:
        """Delete its jobs and their edges, once it has finished (with ``force``: its waiting
        and queued jobs too) (:func:`~sa_jobqueue.ops.delete_workflow`)."""
        return workflow_ops.delete_workflow(session, self.id, force=force)


@dataclass(frozen=True)
class Step:
    """One named step of a :class:`Dag`: its :class:`Call`, what it ``needs`` (step names of
    the same DAG or of the workflow it is added to, or job ids), and what a need that ends dead
    or cancelled does to it (``on_failure``, as :class:`Dependency`'s)."""

    name: str
    call: Call
    needs: tuple[str | int, ...] = ()
    on_failure: OnFailure = "cancel"


class Dag:
    """A workflow of named steps, each naming the steps it needs, for :meth:`JobQueue.workflow
    <sa_jobqueue.JobQueue.workflow>` (or ``add_steps``)::

        dag = Dag()
        dag.add("fetch", Call("fetch", {"url": url}))
        dag.add("thumbnail", Call("thumbnail"), needs=["fetch"])
        dag.add("index", Call("index"), needs=["fetch"])
        dag.add("publish", Call("publish"), needs=["thumbnail", "index"])
        flow = queue.workflow(session, dag)

    :meth:`add` refuses a name used twice at once; a need of an unknown name, and a cycle, are
    refused when the DAG is enqueued (a later step may be named first), with
    :class:`~sa_jobqueue.errors.InvalidWorkflowError`, before anything is sent. A need may
    also be a job id (an int): any job, as ``depends_on`` takes. Not promised: an order among
    steps that need nothing of each other.
    """

    def __init__(self) -> None:
        self._steps: dict[str, Step] = {}

    @property
    def steps(self) -> list[Step]:
        """The steps, in the order they were added."""
        return list(self._steps.values())

    def add(
        self,
        name: str,
        call: Call,
        *,
        needs: Sequence[str | int] = (),
        on_failure: OnFailure = "cancel",
    ) -> Dag:
        """Add step ``name`` running ``call`` once every step or job of ``needs`` has ended;
        returns the DAG, so calls can be chained. InvalidWorkflowError for a bad name, a name
        used twice, or a need named twice; InvalidJobError for a bad ``on_failure``."""
        if not isinstance(name, str) or not 1 <= len(name) <= MAX_STEP_NAME:
            raise InvalidWorkflowError(
                f"a step's name is a str of 1 to {MAX_STEP_NAME} characters, not {name!r}"[:200]
            )
        if name in self._steps:
            raise InvalidWorkflowError(f"two steps are named {name!r}")
        if name == ERROR_STEP:
            raise InvalidWorkflowError(
                f"the step name {ERROR_STEP!r} is the workflow's error callback's: choose another"
            )
        if not isinstance(call, Call):
            raise InvalidWorkflowError(f"step {name!r} runs a Call, not {call!r}"[:200])
        if isinstance(needs, (str, bytes, int)) or not isinstance(needs, Sequence):
            raise InvalidWorkflowError(f"needs is a list of step names or job ids, not {needs!r}")
        for need in needs:
            if isinstance(need, bool) or not isinstance(need, (str, int)):
                raise InvalidWorkflowError(f"a need is a step name or a job id, not {need!r}")
        if len(set(needs)) != len(needs):
            raise InvalidWorkflowError(f"step {name!r} needs a step twice")
        if name in needs:
            raise InvalidWorkflowError(f"step {name!r} needs itself")
        Dependency(0, on_failure)  # its check of on_failure
        self._steps[name] = Step(name, call, tuple(needs), on_failure)
        return self

    def ordered(self, known: frozenset[str] = frozenset()) -> list[Step]:
        """The steps, each after the steps it needs (in the order added where free);
        InvalidWorkflowError for a need that is neither a step of it nor in ``known`` (the
        names of the workflow it is added to), and for a cycle. No I/O."""
        if not self._steps:
            raise InvalidWorkflowError("a DAG needs at least one step")
        if len(self._steps) > workflow_ops.MAX_WORKFLOW_JOBS:
            raise InvalidWorkflowError(
                f"a workflow has at most {workflow_ops.MAX_WORKFLOW_JOBS} jobs"
            )
        waits: dict[str, set[str]] = {}
        for step in self._steps.values():
            names = {n for n in step.needs if isinstance(n, str)}
            unknown = sorted(names - set(self._steps) - known)
            if unknown:
                raise InvalidWorkflowError(
                    f"step {step.name!r} needs {', '.join(map(repr, unknown))}: no such step"
                )
            waits[step.name] = names & set(self._steps)
        done: list[Step] = []
        placed: set[str] = set()
        while len(done) < len(self._steps):
            ready = [
                s for s in self._steps.values() if s.name not in placed and waits[s.name] <= placed
            ]
            if not ready:
                cycle = sorted(set(self._steps) - placed)
                raise InvalidWorkflowError(
                    "the steps " + ", ".join(map(repr, cycle[:10])) + " need each other (a cycle)"
                )
            done += ready
            placed |= {s.name for s in ready}
        return done
