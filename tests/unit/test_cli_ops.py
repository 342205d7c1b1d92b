"""The operator commands: argument parsing and the error line, without a database."""

from __future__ import annotations

import argparse
from datetime import timedelta

import pytest

from sa_jobqueue import cli
from sa_jobqueue.cli._values import duration as _duration


def test_unreachable_database_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    url = "postgresql://nobody@127.0.0.1:1/none"
    assert cli.main(["stats", "--database-url", url]) == 1
    assert "cannot connect" in capsys.readouterr().err
    assert cli.main(["check", "--database-url", url]) == 2  # a probe: unreachable is critical
    err = capsys.readouterr().err
    assert err.startswith("sa-jobqueue: cannot connect")
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30s", timedelta(seconds=30)),
        ("5m", timedelta(minutes=5)),
        ("2h", timedelta(hours=2)),
        ("7d", timedelta(days=7)),
        ("1.5h", timedelta(minutes=90)),
        ("90", timedelta(seconds=90)),
        ("0", timedelta(0)),
    ],
)
def test_durations(text: str, expected: timedelta) -> None:
    assert _duration(text) == expected


@pytest.mark.parametrize("text", ["", "5 weeks", "-1m", "m", "1e9999d", "1y"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="duration"):
        _duration(text)


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (
            ["queues", "limit", "q", "--rate", "4/0s"],
            "a rate's period must be 1 ms or longer, not 0s",
        ),
        (["queues", "limit", "q", "--key-rate", "4/0.0001s"], "not 0.1ms"),
    ],
)
def test_cli_errors_show_durations_as_people_write_them(
    args: list[str], shown: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        cli.main([*args, "--database-url", "postgresql://nobody@127.0.0.1:1/none"])
    err = capsys.readouterr().err
    assert shown in err
    assert "datetime." not in err
    assert "day, " not in err


def test_operations_errors_show_durations_as_people_write_them() -> None:
    from sa_jobqueue.errors import InvalidJobError
    from sa_jobqueue.ops.filters import check_age

    with pytest.raises(
        InvalidJobError, match=r"^older_than must be a timedelta of 0s or more, not -5s$"
    ):
        check_age(timedelta(seconds=-5))
