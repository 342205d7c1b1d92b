"""Async handlers: what is refused without a database."""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session

from sa_jobqueue import JobContext


def test_async_session_outside_an_async_handler_is_refused() -> None:
    ctx = JobContext(job_id=1, task="t", queue="q", attempt=1, max_attempts=1, session=Session())
    with pytest.raises(RuntimeError, match="async def handler"):
        _ = ctx.async_session
