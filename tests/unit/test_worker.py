"""The worker's pure parts: backoff jitter, without a database."""

from __future__ import annotations

from datetime import timedelta

from sa_jobqueue import Backoff


def test_backoff_jitter_stays_within_bounds_and_cap() -> None:
    backoff = Backoff(base=timedelta(seconds=2), cap=timedelta(seconds=60), jitter=0.25)
    for attempt in range(1, 12):
        nominal = min(60.0, 2.0 * 2 ** (attempt - 1))
        for _ in range(50):
            delay = backoff.delay(attempt).total_seconds()
            assert nominal * 0.75 <= delay <= min(nominal * 1.25, 60.0)
    assert timedelta(seconds=45) <= backoff.delay(10_000) <= timedelta(seconds=60)
