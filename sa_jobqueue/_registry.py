"""The tasks and periodic schedules of one JobQueue, each under a name of its own.

No I/O: a registry is filled at import time (``@queue.task``, ``@queue.periodic``) and read by
enqueue (a name to its :class:`~sa_jobqueue.tasks.Task`), by workers (which tasks and queues
exist, which schedules are due) and by :func:`sa_jobqueue.periodic.enqueue_due`. It is not
locked: register tasks before other threads start using the queue, as at import time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ._validation import check_task_name
from .errors import TaskDefinitionError, UnknownTaskError
from .periodic import Schedule
from .tasks import Handler, Task


def handler_name(handler: Handler) -> str:
    """The name a task takes from its handler when none is given: the function's name."""
    return str(getattr(handler, "__name__", ""))


class TaskRegistry:
    """Tasks by name, and the cron schedules declared for them by schedule name."""

    def __init__(self, tasks: Iterable[Task] = ()) -> None:
        self._tasks: dict[str, Task] = {}
        self._schedules: dict[str, Schedule] = {}
        for task in tasks:
            self.add(task)

    @property
    def tasks(self) -> dict[str, Task]:
        """The registered tasks by name (a copy)."""
        return dict(self._tasks)

    @property
    def schedules(self) -> dict[str, Schedule]:
        """The declared schedules by name (a copy)."""
        return dict(self._schedules)

    def add(self, task: Task) -> Task:
        """Register ``task``; TaskDefinitionError if its name is taken."""
        if task.name in self._tasks:
            raise TaskDefinitionError(f"a task named {task.name!r} is already registered")
        self._tasks[task.name] = task
        return task

    def get(self, name: str) -> Task:
        """The task registered under ``name``; UnknownTaskError naming the known ones if none."""
        try:
            return self._tasks[name]
        except KeyError:
            known = ", ".join(sorted(self._tasks)) or "none"
            raise UnknownTaskError(
                f"no task named {name!r} is registered (registered: {known})"
            ) from None

    def lookup(self, task: str | Task) -> Task:
        """What enqueue was given as its task: a Task as it is, or the task of that name.

        A Task need not be registered here. A function raises TypeError saying what to pass;
        anything else is taken for a name (InvalidNameError if it is not a valid one).
        """
        if isinstance(task, Task):
            return task
        if callable(task):
            raise TypeError(self._not_a_task(task))
        return self.get(check_task_name(task))

    def _not_a_task(self, task: object) -> str:
        message = (
            "enqueue takes a registered task (the Task that @queue.task returned) or a task"
            f" name string, not {task!r} ({type(task).__name__})"
        )
        named = [t.name for t in self._tasks.values() if t.handler is task]
        if named:
            message += f"; it is the handler of task {named[0]!r}: pass that name instead"
        return message

    def add_schedule(
        self,
        task: Task,
        *,
        cron: str,
        timezone: str,
        payload: Mapping[str, Any] | None,
        name: str | None,
        task_added_for_it: bool = False,
    ) -> Schedule:
        """Declare a schedule running registered ``task`` on ``cron`` (see :class:`Schedule`).

        TaskDefinitionError if ``task`` is not this registry's, the schedule is invalid or its
        name is taken. ``task_added_for_it``: the task was registered just for this schedule,
        and is unregistered again if the schedule is refused.
        """
        if self._tasks.get(task.name) is not task:
            raise TaskDefinitionError(f"task {task.name!r} is not registered with this queue")
        try:
            schedule = Schedule(
                name=task.name if name is None else name,
                task=task,
                cron=cron,
                timezone=timezone,
                payload={} if payload is None else payload,
            )
            if schedule.name in self._schedules:
                raise TaskDefinitionError(
                    f"a schedule named {schedule.name!r} is already declared: give this"
                    " one a name=... of its own"
                )
        except TaskDefinitionError:
            if task_added_for_it:
                del self._tasks[task.name]
            raise
        self._schedules[schedule.name] = schedule
        return schedule
