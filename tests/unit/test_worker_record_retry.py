"""Outcomes written on the job's thread are tried again on transient errors, for a while."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import IntegrityError, OperationalError

from sa_jobqueue._binds import transient
from sa_jobqueue.worker import _retries
from sa_jobqueue.worker._retries import retrying


def refused() -> OperationalError:
    return OperationalError("UPDATE ...", {}, Exception("FATAL: too many clients already"))


def test_a_transient_error_is_retried_until_the_write_succeeds() -> None:
    tries: list[int] = []

    def write() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise refused()
        return "written"

    assert retrying(write, "recording") == "written"
    assert len(tries) == 3


def test_an_error_in_the_statement_itself_is_not_retried() -> None:
    tries: list[int] = []
    bad = IntegrityError("UPDATE ...", {}, Exception("violates a check constraint"))

    def write() -> None:
        tries.append(1)
        raise bad

    assert not transient(bad)
    with pytest.raises(IntegrityError):
        retrying(write, "recording")
    assert len(tries) == 1


def test_retrying_gives_up_after_record_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_retries, "RECORD_RETRY", 0.2)

    def write() -> None:
        raise refused()

    with pytest.raises(OperationalError):
        retrying(write, "recording")
