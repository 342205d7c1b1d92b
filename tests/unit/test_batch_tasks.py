"""Declaring batch tasks: options checked at declaration, typed payloads from the annotation."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from sa_jobqueue import BatchContext, BatchJob, JobQueue
from sa_jobqueue.errors import InvalidJobError, TaskDefinitionError


@dataclass
class Order:
    order_id: int


def test_a_batch_task_is_a_task_with_its_batching() -> None:
    queue = JobQueue()

    @queue.batch_task(max_size=50, max_wait=timedelta(seconds=1), batch_key="tenant")
    def orders(ctx: BatchContext, jobs: list[BatchJob[dict[str, Any]]]) -> None: ...

    assert queue.get_task("orders") is orders
    assert orders.batching is not None
    assert (orders.batching.max_size, orders.batching.batch_key) == (50, "tenant")
    assert orders.payload_type is None


def test_the_payload_type_comes_from_the_jobs_annotation() -> None:
    pytest.importorskip("pydantic")
    queue = JobQueue()

    @queue.batch_task()
    def typed(ctx: BatchContext, jobs: list[BatchJob[Order]]) -> None: ...

    assert typed.payload_type is Order


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_size": 0}, "max_size must be from 1"),
        ({"max_size": True}, "max_size must be an int"),
        ({"max_wait": 5}, "max_wait must be a timedelta"),
        ({"max_wait": timedelta(seconds=11)}, "at most a third of the lease"),
        ({"batch_key": ""}, "batch_key is the name of a top-level payload field"),
    ],
)
def test_bad_options_are_refused_at_declaration(options: dict[str, Any], message: str) -> None:
    queue = JobQueue()
    with pytest.raises(TaskDefinitionError, match=message):

        @queue.batch_task(**options)
        def bad(ctx: BatchContext, jobs: list[BatchJob[Any]]) -> None: ...


def test_a_verdict_for_a_job_of_another_batch_is_refused() -> None:
    ctx = BatchContext(task="t", queue="q", job_ids=[1], members=[], session=lambda: None)  # type: ignore[arg-type,return-value]
    job = BatchJob(2, {}, 1, 5, None)  # type: ignore[arg-type]
    with pytest.raises(InvalidJobError, match="not a job of this batch"):
        ctx.fail(job, "no")
    mine = BatchJob(1, {}, 1, 5, None)  # type: ignore[arg-type]
    ctx.retry(mine, after=timedelta(seconds=1))
    assert list(ctx._marks) == [1]
