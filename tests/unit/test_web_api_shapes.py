"""The JSON API's shapes of the pages' reads: JSON text embedded only when it came whole."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sa_jobqueue.web._api_shapes import embedded, moment, queue, seconds
from sa_jobqueue.web._queue_reads import CHART_MINUTES, QueueRow


def test_json_text_is_embedded_only_whole_and_readable() -> None:
    assert embedded('{"a": [1, 2]}', 13) == ({"a": [1, 2]}, True)
    assert embedded('{"a": [1, ', 13) == (None, False)  # cut by the database
    assert embedded(None, None) == (None, True)  # nothing stored
    deep = "[" * 100_000 + "]" * 100_000  # jsonb takes it; Python's json module does not
    assert embedded(deep, len(deep)) == (None, False)


def test_moments_keep_their_offset_and_durations_are_seconds() -> None:
    assert moment(datetime(2026, 11, 27, 5, 1, 2, tzinfo=UTC)) == "2026-11-27T05:01:02+00:00"
    assert moment(None) is None
    assert seconds(timedelta(minutes=2, milliseconds=500)) == 120.5


def test_a_queue_without_finished_jobs_still_has_every_status() -> None:
    shaped = queue(QueueRow(name="idle"))
    assert shaped["finished_last_hour"] == {"succeeded": 0, "dead": 0, "cancelled": 0}
    assert all(len(v) == CHART_MINUTES for v in shaped["finished_per_minute"].values())
    assert shaped["held_back_by"] == []
