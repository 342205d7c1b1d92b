"""The Worker refuses options out of range with an error of ours that is still a ValueError."""

from __future__ import annotations

import inspect
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from sa_jobqueue import JobQueue, JobQueueError, Worker
from sa_jobqueue.errors import WorkerConfigError

ENGINE = sa.create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")  # never connected


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"concurrency": 0}, "concurrency must be at least 1"),
        ({"prefetch": -1}, "prefetch must not be negative"),
        ({"queues": {}}, "each queue's concurrency must be at least 1"),
        ({"queues": {"a": 0}}, "each queue's concurrency must be at least 1"),
        ({"retention": timedelta(seconds=-1)}, "retention must not be negative"),
    ],
)
def test_options_out_of_range_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(WorkerConfigError, match=message) as raised:
        Worker(JobQueue(), ENGINE, **options)
    assert isinstance(raised.value, ValueError)  # callers catching ValueError still do
    assert isinstance(raised.value, JobQueueError)


def test_the_error_says_something_by_default() -> None:
    doc = inspect.getdoc(WorkerConfigError)
    assert doc is not None
    assert str(WorkerConfigError()) == doc.splitlines()[0]
