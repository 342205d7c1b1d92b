"""The task registry: names, lookups and schedules, without a database."""

from __future__ import annotations

import ast
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import sa_jobqueue
from sa_jobqueue import JobContext, JobQueue, Task
from sa_jobqueue._registry import TaskRegistry
from sa_jobqueue.batching import Batching
from sa_jobqueue.errors import InvalidNameError, TaskDefinitionError, UnknownTaskError


def send(ctx: JobContext, payload: Any) -> None:
    """Never run: these tests only register."""


def other(ctx: JobContext, payload: Any) -> None:
    """Never run: these tests only register."""


def test_tasks_are_found_by_name() -> None:
    registry = TaskRegistry()
    task = registry.add(Task(name="send", handler=send))
    assert registry.get("send") is task
    assert registry.tasks == {"send": task}


def test_a_name_is_taken_once() -> None:
    registry = TaskRegistry([Task(name="send", handler=send)])
    with pytest.raises(TaskDefinitionError, match="'send' is already registered"):
        registry.add(Task(name="send", handler=other))
    assert registry.get("send").handler is send


def test_an_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(UnknownTaskError, match=r"\(registered: none\)"):
        TaskRegistry().get("send")
    registry = TaskRegistry([Task(name="b", handler=send), Task(name="a", handler=other)])
    with pytest.raises(UnknownTaskError, match=r"no task named 'c' .*\(registered: a, b\)"):
        registry.get("c")


def test_tasks_and_schedules_are_handed_out_as_copies() -> None:
    registry = TaskRegistry([Task(name="send", handler=send)])
    registry.add_schedule(
        registry.get("send"), cron="0 * * * *", timezone="UTC", payload=None, name=None
    )
    registry.tasks.clear()
    registry.schedules.clear()
    assert list(registry.tasks) == ["send"]
    assert list(registry.schedules) == ["send"]


def test_lookup_takes_a_task_or_a_name() -> None:
    registry = TaskRegistry([Task(name="send", handler=send)])
    elsewhere = Task(name="elsewhere", handler=other)
    assert registry.lookup("send") is registry.get("send")
    assert registry.lookup(elsewhere) is elsewhere  # a Task need not be registered here
    with pytest.raises(InvalidNameError):
        registry.lookup("no spaces")
    with pytest.raises(UnknownTaskError):
        registry.lookup("missing")


def test_lookup_of_a_function_says_what_to_pass() -> None:
    registry = TaskRegistry([Task(name="mail", handler=send)])
    with pytest.raises(TypeError, match="it is the handler of task 'mail': pass that name"):
        registry.lookup(send)  # type: ignore[arg-type]
    with pytest.raises(TypeError) as raised:
        registry.lookup(print)  # type: ignore[arg-type]
    assert "handler of task" not in str(raised.value)


def test_a_schedule_is_named_after_its_task_unless_named() -> None:
    registry = TaskRegistry([Task(name="send", handler=send)])
    task = registry.get("send")
    first = registry.add_schedule(
        task, cron="0 3 * * *", timezone="Europe/Paris", payload={"k": 1}, name=None
    )
    second = registry.add_schedule(
        task, cron="0 4 * * *", timezone="UTC", payload=None, name="send.late"
    )
    assert (first.name, first.task, first.payload) == ("send", task, {"k": 1})
    assert (second.name, second.payload) == ("send.late", {})
    assert registry.schedules == {"send": first, "send.late": second}


def test_a_schedule_needs_a_task_of_this_registry() -> None:
    registry = TaskRegistry([Task(name="send", handler=send)])
    impostor = Task(name="send", handler=other)  # same name, another task
    with pytest.raises(TaskDefinitionError, match="not registered with this queue"):
        registry.add_schedule(impostor, cron="* * * * *", timezone="UTC", payload=None, name=None)
    assert registry.schedules == {}


@pytest.mark.parametrize("added_for_it", [True, False])
def test_a_refused_schedule_unregisters_only_a_task_added_for_it(added_for_it: bool) -> None:
    registry = TaskRegistry([Task(name="send", handler=send)])
    with pytest.raises(TaskDefinitionError, match="bad cron expression"):
        registry.add_schedule(
            registry.get("send"),
            cron="61 * * * *",
            timezone="UTC",
            payload=None,
            name=None,
            task_added_for_it=added_for_it,
        )
    assert ("send" in registry.tasks) is not added_for_it


def test_a_schedule_name_is_taken_once() -> None:
    registry = TaskRegistry([Task(name="send", handler=send)])
    registry.add_schedule(
        registry.get("send"), cron="0 * * * *", timezone="UTC", payload=None, name=None
    )
    with pytest.raises(TaskDefinitionError, match="already declared"):
        registry.add_schedule(
            registry.get("send"), cron="5 * * * *", timezone="UTC", payload=None, name=None
        )


def test_the_queue_keeps_its_registry_behind_its_methods() -> None:
    queue = JobQueue(default_queue="main")
    task = queue.task(send)
    assert (task.name, task.queue) == ("send", "main")
    assert queue.get_task("send") is task
    with pytest.raises(TaskDefinitionError):
        queue.periodic("not cron")(other)  # a bare handler, registered for the schedule
    assert list(queue.tasks) == ["send"]
    assert queue.periodic("0 * * * *")(other).name == "other"
    assert list(queue.schedules) == ["other"]


def test_the_periodic_module_does_not_import_the_queue() -> None:
    # periodic.enqueue_due takes anything with schedules and a payload limit; importing
    # queue.py from periodic.py would bring back the circle queue -> registry -> periodic.
    source = Path(sa_jobqueue.__file__).with_name("periodic.py").read_text()
    imported = {
        node.module
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and node.module is not None
    }
    assert not {"queue", "sa_jobqueue.queue"} & imported


def test_a_hard_timeout_needs_a_sync_handler_its_child_can_import() -> None:
    queue = JobQueue()
    limit = timedelta(seconds=5)
    assert queue.task(hard_timeout=limit)(send).hard_timeout == limit

    async def asynchronous(ctx: JobContext, payload: Any) -> None:
        """Never run."""

    def nested(ctx: JobContext, payload: Any) -> None:
        """Never run."""

    for handler, why in ((asynchronous, "for sync handlers"), (nested, "top level")):
        with pytest.raises(TaskDefinitionError, match=why):
            queue.task(name=handler.__name__, hard_timeout=limit)(handler)
    with pytest.raises(TaskDefinitionError, match="hard_timeout must be a timedelta"):
        queue.task(name="bad", hard_timeout=5)(other)  # type: ignore[arg-type]
    with pytest.raises(TaskDefinitionError, match="not for batch tasks"):
        Task(name="batch", handler=other, hard_timeout=limit, batching=Batching())
    assert sorted(queue.tasks) == ["send"]
