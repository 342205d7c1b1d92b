"""Chains, groups, chords and DAGs of :class:`~sa_jobqueue.workflows.Call` s, as works for the
Enqueuer's shells: each a function of the Connection to write through, returning the
:class:`~sa_jobqueue.workflows.Workflow` it made (or added steps to).

Each work draws its workflow's id first, and every job it inserts carries it (a DAG's jobs
their step's name too). A call's options are checked when its turn comes (after the calls
before it were sent), as each was one enqueue of its own; the shape of the workflow (its size,
a DAG's names and cycles) is checked before anything is sent.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence

from sqlalchemy import Connection

from .._sql import workflows as workflows_sql
from ..errors import InvalidWorkflowError
from ..ops import workflows as workflow_ops
from ..workflows import (
    Call,
    Dag,
    Dependency,
    OnFailure,
    Step,
    Workflow,
    check_call_options,
    check_dependencies,
    lock_dependencies,
)
from .enqueuer import Enqueuer
from .inserting import insert_many
from .jobs import Enqueued, Membership
from .options import Callback


def chain_of(
    enqueuer: Enqueuer,
    calls: Sequence[Call],
    depends_on: Sequence[int | Dependency] | None,
    on_failure: OnFailure,
    on_error: Callback | None = None,
) -> Callable[[Connection], Workflow]:
    """``calls``, each waiting for the one before (the first for ``depends_on``); with
    ``on_error``, the workflow's error callback, carried by each of its jobs."""
    first_edges = check_dependencies(depends_on)
    _check_size(len(calls))

    def chain(conn: Connection) -> Workflow:
        member = Membership(functools.partial(_new_id, conn), callback=on_error)
        ids: list[Enqueued] = []
        edges = first_edges
        for call in calls:
            new = frozenset(ids[-1:])
            (job_id,) = _enqueue_calls(enqueuer, conn, [call], edges, new, member)
            ids.append(job_id)
            edges = [Dependency(job_id, on_failure)]
        return Workflow(member.workflow_id, ids)

    return chain


def group_of(
    enqueuer: Enqueuer, calls: Sequence[Call], on_error: Callback | None = None
) -> Callable[[Connection], Workflow]:
    """``calls`` side by side; calls of one task with the same options go in together."""
    _check_size(len(calls))

    def group(conn: Connection) -> Workflow:
        member = Membership(functools.partial(_new_id, conn), callback=on_error)
        return Workflow(member.workflow_id, _members(enqueuer, conn, calls, member))

    return group


def chord_of(
    enqueuer: Enqueuer,
    calls: Sequence[Call],
    callback: Call,
    on_failure: OnFailure,
    on_error: Callback | None = None,
) -> Callable[[Connection], Workflow]:
    """A group of ``calls`` and a ``callback`` that waits for all of them (the last job)."""
    _check_size(len(calls) + 1)

    def chord(conn: Connection) -> Workflow:
        member = Membership(functools.partial(_new_id, conn), callback=on_error)
        members = _members(enqueuer, conn, calls, member)
        edges = [Dependency(job_id, on_failure) for job_id in members]
        (last,) = _enqueue_calls(enqueuer, conn, [callback], edges, frozenset(members), member)
        return Workflow(member.workflow_id, [*members, last])

    return chord


def dag_of(
    enqueuer: Enqueuer, dag: Dag, on_error: Callback | None = None
) -> Callable[[Connection], Workflow]:
    """The steps of ``dag``, each waiting for the steps (and jobs) it needs."""
    ordered = dag.ordered()

    def build(conn: Connection) -> Workflow:
        return _add(enqueuer, conn, _new_id(conn), ordered, {}, on_error)

    return build


def add_steps_of(
    enqueuer: Enqueuer, workflow_id: int, dag: Dag
) -> Callable[[Connection], Workflow]:
    """``dag``'s steps added to the existing workflow ``workflow_id``: they may need its steps
    by name (or its jobs, or any job, by id), and nothing of it may come to need them."""
    checked = workflow_ops.check_workflow_id(workflow_id)
    own = {s.name for s in dag.steps}
    names = sorted({n for s in dag.steps for n in s.needs if isinstance(n, str)} - own)
    dag.ordered(frozenset(names))  # its own shape (size, cycles) before any I/O

    def add(conn: Connection) -> Workflow:
        # The workflow's lock: a cancel, retry or delete of it waits for this transaction, and
        # then sees the steps it added (see _sql.workflows.lock_workflow).
        conn.execute(workflows_sql.lock_workflow(), {"workflow_id": checked})
        rows = workflow_ops.read_jobs(conn, checked, locked=False, most=_room(dag))
        if len(rows) + len(dag.steps) > workflow_ops.MAX_WORKFLOW_JOBS:
            raise InvalidWorkflowError(
                f"a workflow has at most {workflow_ops.MAX_WORKFLOW_JOBS} jobs"
            )
        taken = sorted({r.workflow_step for r in rows} & {s.name for s in dag.steps})
        if taken:
            raise InvalidWorkflowError(
                f"workflow {checked} has steps named {', '.join(map(repr, taken))} already"
            )
        found = {r.workflow_step: Enqueued(r.id) for r in rows if r.workflow_step in names}
        ordered = dag.ordered(frozenset(found))
        return _add(enqueuer, conn, checked, ordered, found)

    return add


def _room(dag: Dag) -> int:
    """How many of a workflow's jobs to read: enough to tell whether ``dag`` fits in it."""
    return workflow_ops.MAX_WORKFLOW_JOBS - len(dag.steps) + 1


def _add(
    enqueuer: Enqueuer,
    conn: Connection,
    workflow_id: int,
    ordered: list[Step],
    known: dict[str, Enqueued],
    on_error: Callback | None = None,
) -> Workflow:
    """Enqueue ``ordered`` steps into the workflow, one statement or three each; ``known``:
    the ids of the names they may need besides their own."""
    ids = dict(known)
    created: list[Enqueued] = []
    # Every job named by id is looked for first: an unknown one raises before any step is
    # inserted, not halfway through the DAG.
    named = sorted({n for step in ordered for n in step.needs if not isinstance(n, str)})
    if named:
        lock_dependencies(conn, [Dependency(job_id) for job_id in named])
    for step in ordered:
        needs = [ids[n] if isinstance(n, str) else n for n in step.needs]
        edges = [Dependency(job_id, step.on_failure) for job_id in needs]
        new = frozenset(created) & frozenset(needs)
        member = Membership(workflow_id, step.name, on_error)
        (job_id,) = _enqueue_calls(enqueuer, conn, [step.call], edges, new, member)
        ids[step.name] = job_id
        created.append(job_id)
    return Workflow(workflow_id, created, {s.name: ids[s.name] for s in ordered})


def _new_id(conn: Connection) -> int:
    return int(conn.execute(workflows_sql.next_workflow_id()).scalar_one())


def _check_size(jobs: int) -> None:
    if jobs < 1:
        raise InvalidWorkflowError("a workflow needs at least one job")
    if jobs > workflow_ops.MAX_WORKFLOW_JOBS:
        raise InvalidWorkflowError(
            f"a workflow has at most {workflow_ops.MAX_WORKFLOW_JOBS} jobs, not {jobs}"
        )


def _members(
    enqueuer: Enqueuer, conn: Connection, calls: Sequence[Call], member: Membership
) -> list[Enqueued]:
    """``calls`` side by side in the workflow; calls of one task with the same options go in
    together."""
    ids: list[Enqueued] = []
    for _, run in itertools.groupby(calls, key=_batch_key):
        ids += _enqueue_calls(enqueuer, conn, list(run), [], frozenset(), member)
    return ids


def _enqueue_calls(
    enqueuer: Enqueuer,
    conn: Connection,
    calls: list[Call],
    edges: list[Dependency],
    new: frozenset[int],
    member: Membership,
) -> list[Enqueued]:
    """Enqueue ``calls`` (one task, the same options) into ``member``'s workflow, waiting for
    ``edges``; ``new``: the dependencies enqueued in this transaction."""
    first = calls[0]
    options = check_call_options(first.options)
    payloads = [call.payload for call in calls]
    insert = functools.partial(insert_many, member=member)
    return enqueuer.work(first.task, payloads, None, options, insert, edges, new)(conn)


def _batch_key(call: Call) -> tuple[str, str]:
    """Calls that can go in together: the same task and the same options."""
    task = call.task if isinstance(call.task, str) else call.task.name
    return task, repr(sorted(call.options.items()))
