"""Retry and Discard: what is refused without a database."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sa_jobqueue import Retry


def test_retry_refuses_a_negative_or_non_timedelta_delay() -> None:
    with pytest.raises(TypeError):
        Retry(after=timedelta(seconds=-1))
    with pytest.raises(TypeError):
        Retry(after=5)  # type: ignore[arg-type]
