"""The task registry, the error classes and database URLs: the enqueue side without a database."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from sa_jobqueue import Backoff, InvalidJobError, JobContext, JobQueue, JobQueueError, Task
from sa_jobqueue.errors import (
    DatabaseUnavailableError,
    InvalidNameError,
    InvalidScheduleError,
    PayloadError,
    TaskDefinitionError,
    UnknownTaskError,
)
from tests.helpers.jobs import handler, make_queue
from tests.helpers.processes import run_cli


def test_error_classes_follow_the_documented_hierarchy() -> None:
    for cls in (InvalidJobError, TaskDefinitionError):
        assert issubclass(cls, JobQueueError)
        assert issubclass(cls, ValueError)
    for cls in (PayloadError, InvalidNameError, InvalidScheduleError):
        assert issubclass(cls, InvalidJobError)
        assert issubclass(cls, ValueError)
    assert issubclass(UnknownTaskError, JobQueueError)
    assert issubclass(UnknownTaskError, LookupError)
    assert not issubclass(UnknownTaskError, InvalidJobError)


def test_bare_decorator_registers_with_defaults() -> None:
    queue = JobQueue()
    calls: list[Any] = []

    @queue.task
    def send_welcome(ctx: JobContext, payload: Any) -> str:
        calls.append(payload)
        return "sent"

    assert isinstance(send_welcome, Task)
    assert queue.get_task("send_welcome") is send_welcome
    assert queue.tasks == {"send_welcome": send_welcome}
    assert (send_welcome.queue, send_welcome.priority, send_welcome.max_attempts) == (
        "default",
        0,
        5,
    )
    assert send_welcome.lease == timedelta(seconds=30)
    assert send_welcome.backoff == Backoff()
    # Calling the task calls the handler.
    assert send_welcome(None, {"user": 1}) == "sent"  # type: ignore[arg-type]
    assert calls == [{"user": 1}]


def test_decorator_with_options() -> None:
    queue = JobQueue(default_queue="main")
    backoff = Backoff(base=timedelta(seconds=2), cap=timedelta(minutes=1), jitter=0)

    @queue.task(
        name="reports.build",
        queue="reports",
        priority=-5,
        max_attempts=12,
        lease=timedelta(minutes=2),
        backoff=backoff,
    )
    def build(ctx: JobContext, payload: Any) -> None:
        pass

    @queue.task()
    def defaults(ctx: JobContext, payload: Any) -> None:
        pass

    assert build.name == "reports.build"
    assert (build.queue, build.priority, build.max_attempts) == ("reports", -5, 12)
    assert build.lease == timedelta(minutes=2)
    assert build.backoff is backoff
    assert queue.get_task("reports.build") is build
    assert "build" not in queue.tasks
    assert (defaults.name, defaults.queue) == ("defaults", "main")
    assert set(queue.tasks) == {"reports.build", "defaults"}


def test_duplicate_task_name_is_refused() -> None:
    queue = JobQueue()

    @queue.task
    def notify(ctx: JobContext, payload: Any) -> None:
        pass

    def other(ctx: JobContext, payload: Any) -> None:
        pass

    with pytest.raises(TaskDefinitionError):
        queue.task(name="notify")(other)
    with pytest.raises(TaskDefinitionError):
        queue.task(notify.handler)
    with pytest.raises(TaskDefinitionError):
        queue.task(name="notify", queue="elsewhere")(other)
    # The first registration stands.
    assert queue.get_task("notify") is notify
    assert queue.tasks == {"notify": notify}
    # Names are unique per JobQueue, not globally.
    assert JobQueue().task(notify.handler).name == "notify"


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"priority": 40000}, id="priority"),
        pytest.param({"max_attempts": 0}, id="max_attempts"),
        pytest.param({"lease": timedelta(0)}, id="lease"),
        pytest.param({"queue": "bad queue"}, id="queue"),
        pytest.param({"name": "bad name"}, id="name"),
    ],
)
def test_task_with_bad_options_is_refused(options: dict[str, Any]) -> None:
    # errors.py: TaskDefinitionError is raised when "a task is declared twice, or with bad
    # options"; InvalidJobError is documented as bad input to enqueue.
    queue = JobQueue()
    with pytest.raises(TaskDefinitionError):
        queue.task(**options)(handler)
    assert queue.tasks == {}


def test_tasks_is_a_copy_and_unknown_names_raise() -> None:
    queue = make_queue()
    snapshot = queue.tasks
    snapshot.clear()
    assert set(queue.tasks) == {"work_a", "work_b", "plain"}
    with pytest.raises(UnknownTaskError):
        queue.get_task("missing")
    with pytest.raises(LookupError):
        queue.get_task("missing")


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u@h/db",
        "postgres://u@h/db",
        "postgresql+psycopg://u@h/db",
        "postgresql+psycopg_async://u@h/db",
    ],
)
def test_postgres_urls_of_psycopg3_run_on_psycopg3(url: str) -> None:
    from sa_jobqueue.database import normalise_url

    assert normalise_url(url).drivername == "postgresql+psycopg"


@pytest.mark.parametrize(
    "url", ["postgresql+psycopg2://u@h/db", "postgresql+asyncpg://u@h/db", "postgresql+pg8000://h"]
)
def test_urls_naming_another_driver_are_refused_not_switched(url: str) -> None:
    from sa_jobqueue.database import normalise_url

    driver = url.split("+")[1].split(":")[0]
    with pytest.raises(DatabaseUnavailableError, match=f"names the driver '{driver}'"):
        normalise_url(url)
    done = run_cli("stats", "--database-url", url)
    assert done.returncode != 0
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "psycopg 3" in done.stderr


def test_the_copy_of_new_jobs_names_its_columns_as_quoted_identifiers() -> None:
    from sa_jobqueue._sql.copying import COPY_COLUMNS, copy_jobs
    from sa_jobqueue.models import jobs_table

    assert set(COPY_COLUMNS) <= set(jobs_table.c.keys())
    columns = '"id", "payload", "queue", "task", "priority", "max_attempts", "lease"'
    table = '"sa_jobqueue_jobs"'
    assert copy_jobs("now").as_string(None) == f"COPY {table} ({columns}) FROM STDIN"
    optional = '"visible_at", "trace_context", "backoff"'
    assert copy_jobs("after", traced=True, backoff=True).as_string(None) == (
        f"COPY {table} ({columns}, {optional}) FROM STDIN"
    )
