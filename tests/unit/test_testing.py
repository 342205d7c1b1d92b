"""sa_jobqueue.testing helpers that need no database."""

from __future__ import annotations

import pytest

from sa_jobqueue import JobQueueError
from sa_jobqueue.testing import (
    run_task,
)
from tests.apps.application import describe, describe_async, write_note


def test_run_task_gives_the_handler_a_context_and_a_decoded_payload() -> None:
    payload = {"ids": [1, 2]}
    result = run_task(describe, payload, job_id=42, attempt=2)

    assert result == {
        "job_id": 42,
        "task": "describe",
        "queue": "emails",
        "attempt": 2,
        "max_attempts": 3,
        "payload": {"ids": [1, 2]},
    }
    assert result["payload"] is not payload  # decoded from JSON, as a worker would
    assert run_task(describe_async, "x", attempt=3, max_attempts=4) == "async x attempt 3"


def test_run_task_without_a_session_says_to_pass_one() -> None:
    with pytest.raises(JobQueueError, match=r"uses ctx.session: pass run_task\(\.\.\., session"):
        run_task(write_note, {"text": "hi"})
