"""The command line's durations: one grammar for every option that takes one."""

from __future__ import annotations

import argparse
from datetime import timedelta

import pytest

from sa_jobqueue.cli import _values


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("2", 2), ("0.5", 0.5), (".5", 0.5), ("2s", 2), ("500ms", 0.5), ("1m30s", 90),
     ("1h", 3600), ("7d", 604800), (" 5M ", 300)],
)  # fmt: skip
def test_every_duration_option_reads_seconds_and_units(text: str, seconds: float) -> None:
    expected = timedelta(seconds=seconds)
    assert _values.seconds(text) == expected
    assert _values.duration(text) == expected
    assert _values.retention(text) == expected


@pytest.mark.parametrize("text", ["", "soon", "-5", "5x", "1e3", "nan", "inf", "1m-5s", "s"])
def test_anything_else_is_refused_with_examples(text: str) -> None:
    for read in (_values.seconds, _values.duration, _values.retention):
        with pytest.raises(argparse.ArgumentTypeError, match="not a duration"):
            read(text)


def test_limits_of_each_option() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="more than 0"):
        _values.seconds("0ms")
    assert _values.duration("0") == timedelta(0)
    assert _values.retention("0s") == timedelta(0)
    assert _values.retention("forever") is None
    with pytest.raises(argparse.ArgumentTypeError, match="too long"):
        _values.duration("999999999999d")
