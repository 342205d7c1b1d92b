"""The methods of :class:`~sa_jobqueue.JobQueue` that enqueue workflows: chains, groups,
chords, DAGs of named steps, and steps added to a workflow, each sync and async.

Private: users call these on a ``JobQueue``, which takes them from :class:`WorkflowMethods`.
Each runs the work the queue's :class:`~sa_jobqueue._enqueue.enqueuer.Enqueuer` prepares (see
:mod:`sa_jobqueue._enqueue.calls`) in the caller's transaction. The class holds no state of its
own (the enqueuer is the queue's) and nothing overrides it; it is a base of ``JobQueue`` so that
``queue.py`` holds the registry and the enqueue shells and stays readable in one sitting.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

from ._binds import SessionLike
from ._enqueue.calls import add_steps_of, chain_of, chord_of, dag_of, group_of
from ._enqueue.options import Callback
from ._enqueue.transactions import arun_in, run_in
from .tasks import Task
from .workflows import Call, Dag, Dependency, OnFailure, Workflow

if TYPE_CHECKING:
    from ._binds import AsyncSessionLike
    from ._enqueue.enqueuer import Enqueuer

#: What names an error callback: a task, a task's name, or a ``Call`` (its payload an object).
ErrorCallback: TypeAlias = "Task[Any] | str | Call"


class WorkflowMethods:
    """Enqueue workflows in the caller's transaction (see :mod:`sa_jobqueue.workflows`)."""

    #: The queue's enqueuer (set by ``JobQueue.__init__``).
    _enqueuer: Enqueuer

    def chain(
        self,
        session: SessionLike,
        calls: Sequence[Call],
        *,
        depends_on: Sequence[int | Dependency] | None = None,
        on_failure: OnFailure = "cancel",
        on_error: ErrorCallback | None = None,
    ) -> Workflow:
        """Enqueue ``calls`` in the caller's transaction, each waiting for the one before (the
        first for ``depends_on``, if given): a :class:`~sa_jobqueue.workflows.Workflow`, the
        sequence of their ids in order, with the workflow's ``id`` every one of them carries.

        A step reads what the step before it returned (its task declared with
        ``keep_result=True``) with ``ctx.upstream_results()``. A step that ends dead or
        cancelled cancels the rest of the chain, or, with ``on_failure="run"``, lets the next
        one run anyway. The jobs of ``depends_on`` are not part of the workflow. See
        :mod:`sa_jobqueue.workflows`.

        ``on_error`` (a task, a task name or a ``Call``), the workflow's error callback: a job
        of that task is enqueued once, in the statement that moves the workflow's first job
        to dead, as its step ``"on_error"`` (see the workflows how-to). Every workflow method
        takes it.
        """
        work = chain_of(self._enqueuer, calls, depends_on, on_failure, self._on_error(on_error))
        return run_in(session, work)

    def group(
        self, session: SessionLike, calls: Sequence[Call], *, on_error: ErrorCallback | None = None
    ) -> Workflow:
        """Enqueue ``calls`` to run side by side, in the caller's transaction: a
        :class:`~sa_jobqueue.workflows.Workflow` of their ids, in order. Calls of one task
        with the same options go in together (by COPY from 200 on), so a group of 10,000 is
        a few statements."""
        return run_in(session, group_of(self._enqueuer, calls, self._on_error(on_error)))

    def chord(
        self,
        session: SessionLike,
        calls: Sequence[Call],
        callback: Call,
        *,
        on_failure: OnFailure = "cancel",
        on_error: ErrorCallback | None = None,
    ) -> Workflow:
        """A :meth:`group` and a ``callback`` that runs once every job of the group has ended
        (reading their results with ``ctx.upstream_results()``): a
        :class:`~sa_jobqueue.workflows.Workflow` of the group's ids then the callback's, last
        (``flow[:-1]``, ``flow[-1]``). A member that ends dead or cancelled cancels the
        callback, or, with ``on_failure="run"``, does not stop it."""
        work = chord_of(self._enqueuer, calls, callback, on_failure, self._on_error(on_error))
        return run_in(session, work)

    def workflow(
        self, session: SessionLike, dag: Dag, *, on_error: ErrorCallback | None = None
    ) -> Workflow:
        """Enqueue the named steps of ``dag``, each waiting for the steps it needs, in the
        caller's transaction: a :class:`~sa_jobqueue.workflows.Workflow` whose ``steps`` maps
        each name to its job's id. A cycle, a need of an unknown step or a name used twice
        raises :class:`~sa_jobqueue.errors.InvalidWorkflowError` before anything is sent."""
        return run_in(session, dag_of(self._enqueuer, dag, self._on_error(on_error)))

    def add_steps(self, session: SessionLike, workflow_id: int, dag: Dag) -> Workflow:
        """Add the steps of ``dag`` to the existing workflow ``workflow_id``, in the caller's
        transaction: they may need its steps by name, or any job by id, and run by the same
        rules as any dependency (a need that already succeeded is met, one that ended dead or
        cancelled applies the step's ``on_failure`` at once). Nothing already in the workflow
        can be made to wait for a new step. Returns a Workflow of the new steps alone.

        :class:`~sa_jobqueue.errors.UnknownWorkflowError` if no job carries that id,
        InvalidWorkflowError for a name the workflow (or the DAG) already has, an unknown
        need or a cycle; nothing is added then. Holds the workflow's lock until the caller's
        transaction ends: a cancel, retry or delete of it waits, then sees the new steps.
        """
        return run_in(session, add_steps_of(self._enqueuer, workflow_id, dag))

    async def achain(
        self,
        session: AsyncSessionLike,
        calls: Sequence[Call],
        *,
        depends_on: Sequence[int | Dependency] | None = None,
        on_failure: OnFailure = "cancel",
        on_error: ErrorCallback | None = None,
    ) -> Workflow:
        """:meth:`chain` for an ``AsyncSession`` or ``AsyncConnection``."""
        work = chain_of(self._enqueuer, calls, depends_on, on_failure, self._on_error(on_error))
        return await arun_in(session, work)

    async def agroup(
        self,
        session: AsyncSessionLike,
        calls: Sequence[Call],
        *,
        on_error: ErrorCallback | None = None,
    ) -> Workflow:
        """:meth:`group` for an ``AsyncSession`` or ``AsyncConnection``."""
        return await arun_in(session, group_of(self._enqueuer, calls, self._on_error(on_error)))

    async def achord(
        self,
        session: AsyncSessionLike,
        calls: Sequence[Call],
        callback: Call,
        *,
        on_failure: OnFailure = "cancel",
        on_error: ErrorCallback | None = None,
    ) -> Workflow:
        """:meth:`chord` for an ``AsyncSession`` or ``AsyncConnection``."""
        work = chord_of(self._enqueuer, calls, callback, on_failure, self._on_error(on_error))
        return await arun_in(session, work)

    async def aworkflow(
        self, session: AsyncSessionLike, dag: Dag, *, on_error: ErrorCallback | None = None
    ) -> Workflow:
        """:meth:`workflow` for an ``AsyncSession`` or ``AsyncConnection``."""
        return await arun_in(session, dag_of(self._enqueuer, dag, self._on_error(on_error)))

    def _on_error(self, given: ErrorCallback | None) -> Callback | None:
        """A workflow's error callback, resolved before any SQL (InvalidJobError if bad)."""
        return None if given is None else self._enqueuer.callback(given)

    async def aadd_steps(self, session: AsyncSessionLike, workflow_id: int, dag: Dag) -> Workflow:
        """:meth:`add_steps` for an ``AsyncSession`` or ``AsyncConnection``."""
        return await arun_in(session, add_steps_of(self._enqueuer, workflow_id, dag))
