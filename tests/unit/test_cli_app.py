"""Which files the worker's import errors point at: the user's, never ours or a library's."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import sa_jobqueue
from sa_jobqueue.cli._app import _is_application


def test_our_own_modules_are_not_the_application() -> None:
    package = Path(sa_jobqueue.__file__).parent
    assert not _is_application(str(package / "tasks.py"))
    assert not _is_application(str(package / "cli" / "_app.py"))


def test_the_standard_library_is_not_the_application() -> None:
    assert not _is_application(json.__file__)
    assert not _is_application(argparse.__file__)
    assert not _is_application("<frozen importlib._bootstrap>")


def test_a_file_of_the_users_is(tmp_path: Path) -> None:
    assert _is_application(str(tmp_path / "myapp" / "jobs.py"))
