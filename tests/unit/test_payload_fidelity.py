"""Payload limits that are checked without a database."""

from __future__ import annotations

import re
from typing import Any

import pytest

from sa_jobqueue import JobContext, JobQueue
from sa_jobqueue.errors import TaskDefinitionError
from tests.helpers.periodic import YEARLY


def test_a_periodic_schedule_is_refused_the_same() -> None:
    queue = JobQueue()

    @queue.task
    def report(ctx: JobContext, payload: Any) -> None:  # pragma: no cover - never runs
        pass

    with pytest.raises(TaskDefinitionError, match=re.escape('payload["z"][0]')):
        queue.periodic(YEARLY, payload={"z": [-0.0]})(report)
