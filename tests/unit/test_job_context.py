"""JobContext made by hand (a test's): the row fields a worker fills from the claim."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from sqlalchemy.orm import Session

from sa_jobqueue import JobContext


def test_a_context_made_by_hand_was_created_now() -> None:
    before = datetime.now(UTC)
    ctx = JobContext(job_id=1, task="t", queue="q", attempt=1, max_attempts=1, session=Session())
    assert before <= ctx.created_at <= datetime.now(UTC)
    assert ctx.priority == 0
    given = datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=2)))
    made = JobContext(
        job_id=1,
        task="t",
        queue="q",
        attempt=1,
        max_attempts=1,
        session=Session(),
        created_at=given,
        priority=-3,
    )
    assert (made.created_at, made.priority) == (given, -3)
