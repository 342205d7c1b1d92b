"""Checked by mypy in tests/unit/test_typing.py, never run: what a type checker infers of tasks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict, assert_type

from sa_jobqueue import JobContext, JobQueue
from sa_jobqueue.tasks import Task

queue = JobQueue()


@dataclass
class Order:
    order_id: int


class Mail(TypedDict):
    to: str


@queue.task
def ship(ctx: JobContext, payload: Order) -> None: ...


@queue.task(max_attempts=3, keep_result=True)
def mail(ctx: JobContext, payload: Mail) -> str:
    return payload["to"]


@queue.task
async def ship_async(ctx: JobContext, payload: Order) -> None: ...


@queue.periodic("0 3 * * *", payload={"report": "daily"})
@queue.task
def report(ctx: JobContext, payload: dict[str, str]) -> None: ...


@queue.task
def untyped(ctx: JobContext, payload: Any) -> None: ...


assert_type(ship, Task[Order])
assert_type(mail, Task[Mail])
assert_type(ship_async, Task[Order])
assert_type(report, Task[dict[str, str]])
assert_type(untyped, Task[Any])
