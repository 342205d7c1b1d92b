"""The command line's durations: one grammar for every option that takes one."""

from __future__ import annotations

import argparse
from datetime import timedelta
from pathlib import Path

import pytest

from sa_jobqueue.cli import _values
from sa_jobqueue.cli._arguments import parse_args
from sa_jobqueue.worker._served import NEAR_LEAST, NEAR_MOST, Served


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


def test_queues_take_names_counts_and_patterns() -> None:
    assert _values.queues("a, tenant-*=4,*") == [("a", None), ("tenant-*", 4), ("*", None)]
    with pytest.raises(argparse.ArgumentTypeError, match="invalid queue"):
        _values.queues("tenant-%")


def test_a_queues_file_holds_a_list_too_long_for_a_command_line(tmp_path: Path) -> None:
    listed = tmp_path / "queues.txt"
    names = [f"tenant-{n:05d}" for n in range(10_000)]  # 160 kB: more than one argument holds
    listed.write_text("# tenants\n\n" + "\n".join(names) + "\nemails=8, reports\n")
    read = _values.queues_file(str(listed))
    assert [name for name, _ in read] == [*names, "emails", "reports"]
    assert read[-2:] == [("emails", 8), ("reports", None)]
    with pytest.raises(argparse.ArgumentTypeError, match="cannot read"):
        _values.queues_file(str(tmp_path / "missing.txt"))


def test_the_queues_come_from_the_environment_unless_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SA_JOBQUEUE_QUEUES", "tenant-*,emails")
    args = parse_args(["worker", "app:queue"])
    assert args.queues == [("tenant-*", None), ("emails", None)]
    assert parse_args(["worker", "app:queue", "--queues", "a"]).queues == [("a", None)]


def test_served_matches_names_and_patterns_and_escapes_like() -> None:
    served = Served(["emails", "tenant-*", "t_?"])
    assert "emails" in served
    assert "tenant-42" in served
    assert "t_1" in served
    assert "tx1" not in served  # _ is itself, not LIKE's any character
    assert "reports" not in served
    assert served.params() == {
        "queues": "emails",
        "patterns": ["tenant-%", "t\\__"],
        "near": ",emails,",
    }
    assert served.many
    assert not Served(["emails"]).many


def test_served_near_is_the_listed_names_just_past_the_turn() -> None:
    names = [f"t-{n:05d}" for n in range(3 * NEAR_MOST)]
    served = Served([*reversed(names), "t-*"])
    assert served.params()["queues"] == ",".join(names)  # sorted
    # Eight names a slot, no fewer than NEAR_LEAST, no more than NEAR_MOST.
    assert served.params("", 1)["near"] == "," + ",".join(names[:NEAR_LEAST]) + ","
    assert served.params(names[9], 20)["near"] == "," + ",".join(names[10:170]) + ","
    assert served.params("t-00009x", 20)["near"] == "," + ",".join(names[10:170]) + ","
    assert served.params("", 10_000)["near"] == "," + ",".join(names[:NEAR_MOST]) + ","
    assert served.params(names[-3], 20)["near"] == "," + ",".join(names[-2:]) + ","
    assert served.params(names[-1], 20)["near"] == ","  # none: the walk meets no listed name
    assert Served(["t-*"]).params("", 20)["near"] == ","
