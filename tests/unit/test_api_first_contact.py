"""What a first-time user meets when defining tasks: handler signatures (no database)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest

from sa_jobqueue import JobQueue, Task
from sa_jobqueue.errors import TaskDefinitionError


def two(ctx: Any, payload: Any) -> None: ...


def star(*args: Any) -> None: ...


def ctx_and_star(ctx: Any, *rest: Any) -> None: ...


def payload_default(ctx: Any, payload: Any = None) -> None: ...


def extras(ctx: Any, payload: Any, extra: int = 1, *more: Any, flag: bool = False) -> None: ...


def keywords(ctx: Any, payload: Any, **options: Any) -> None: ...


async def coroutine(ctx: Any, payload: Any) -> None: ...


def three(prefix: str, ctx: Any, payload: Any) -> None: ...


class CallableObject:
    def __call__(self, ctx: Any, payload: Any) -> None: ...


def decorated(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return wrapper


def nothing() -> None: ...


def ctx_only(ctx: Any) -> None: ...


def three_required(ctx: Any, payload: Any, extra: Any) -> None: ...


def keyword_only(ctx: Any, payload: Any, *, tenant: str) -> None: ...


def all_keyword(*, ctx: Any, payload: Any) -> None: ...


def kwargs_only(**options: Any) -> None: ...


@pytest.mark.parametrize(
    "handler",
    [
        two,
        star,
        ctx_and_star,
        payload_default,
        extras,
        keywords,
        coroutine,
        CallableObject(),
        functools.partial(three, "x"),
        decorated(two),
        lambda ctx, payload: None,
    ],
    ids=lambda h: getattr(h, "__name__", type(h).__name__),
)
def test_handlers_that_take_ctx_and_payload_are_accepted(handler: Any) -> None:
    queue = JobQueue()
    task = queue.task(name="job")(handler)
    assert queue.tasks == {"job": task}


@pytest.mark.parametrize(
    "handler",
    [
        nothing,
        ctx_only,
        three_required,
        keyword_only,
        all_keyword,
        kwargs_only,
        decorated(ctx_only),
        lambda: None,
    ],
    ids=lambda h: getattr(h, "__name__", type(h).__name__),
)
def test_handlers_that_cannot_take_ctx_and_payload_are_refused(handler: Any) -> None:
    queue = JobQueue()
    with pytest.raises(TaskDefinitionError) as refused:
        queue.task(name="job")(handler)
    assert "job" in str(refused.value)
    assert queue.tasks == {}  # nothing half-registered
    with pytest.raises(TaskDefinitionError):
        Task(name="job", handler=handler)


def test_a_handler_that_is_not_callable_is_refused() -> None:
    with pytest.raises(TaskDefinitionError):
        Task(name="job", handler="send_welcome")  # type: ignore[arg-type]
