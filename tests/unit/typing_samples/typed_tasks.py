"""Checked by mypy in tests/unit/test_typing.py, never run: what a type checker infers of tasks.

mypy must report an error on each line with the mark ``# error``, and on no other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict, assert_type

from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

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


def enqueue(session: Session) -> None:
    queue.enqueue(session, ship, Order(1))
    queue.enqueue(session, "ship", {"order_id": 1})  # by name: not checked statically
    queue.enqueue(session, untyped, [1, "two"])
    queue.enqueue_many(session, mail, [Mail(to="a"), Mail(to="b")])
    queue.enqueue(session, ship, Mail(to="a"))  # error: not an Order
    queue.enqueue_many(session, ship, [Order(1), Mail(to="a")])  # error: not an Order


async def aenqueue(session: AsyncSession) -> None:
    await queue.aenqueue(session, ship_async, Order(1))
    await queue.aenqueue(session, ship_async, {"order_id": 1})  # error: a dict, not an Order
    await queue.aenqueue_many(session, mail, [Order(1)])  # error: not a Mail
