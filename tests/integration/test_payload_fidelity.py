"""Payloads that cannot arrive intact are refused at enqueue, saying where.

The transaction stays usable afterwards; each test is rolled back. What arrives intact, run by
a real worker, is in tests/acceptance/test_payload_fidelity.py.
"""

from __future__ import annotations

import enum
import re
import sys
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from sa_jobqueue import JobQueue
from sa_jobqueue.errors import PayloadError
from tests.acceptance.test_payload_fidelity import DEPTH, INT_DIGITS, nested, received


class Level(enum.IntEnum):
    HIGH = 1


class Key(enum.StrEnum):
    A = "a"


class Celsius(float):
    pass


class Names(list[str]):
    pass


__all__ = ["received"]  # the fixture: the task these tests enqueue


REFUSED = [
    # numeric has no negative zero: it would arrive as 0.0.
    pytest.param(-0.0, "payload", id="minus-zero"),
    pytest.param({"a": [0.0, 1, 2, -0.0]}, 'payload["a"][3]', id="nested-minus-zero"),
    pytest.param([[{"x": -0.0}]], 'payload[0][0]["x"]', id="minus-zero-in-lists"),
    # One digit past Python's default int-string limit: the worker could not decode it.
    pytest.param(10**INT_DIGITS, "payload", id="int-of-4301-digits"),
    pytest.param({"n": [-(10**INT_DIGITS)]}, 'payload["n"][0]', id="negative-int-of-4301"),
    # Subclasses of JSON's types come back as the plain type: an IntEnum as an int, and so on.
    pytest.param({"level": Level.HIGH}, 'payload["level"]', id="int-enum"),
    pytest.param({"colour": [Key.A]}, 'payload["colour"][0]', id="str-enum"),
    pytest.param({"t": Celsius(21.5)}, 'payload["t"]', id="float-subclass"),
    pytest.param({"n": Names(["x"])}, 'payload["n"]', id="list-subclass"),
    pytest.param(OrderedDict(a=1), "payload", id="dict-subclass"),
    pytest.param({"o": [OrderedDict(a=1)]}, 'payload["o"][0]', id="nested-dict-subclass"),
    pytest.param({Key.A: 1}, "payload", id="str-enum-key"),
    # Deeper than the fixed limit, whatever this process's recursion limit.
    pytest.param(nested(DEPTH + 1, 1), "nested too deeply", id="one-level-too-deep"),
    pytest.param(nested(DEPTH, [1]), "nested too deeply", id="list-one-level-too-deep"),
]


@pytest.fixture
def generous_process() -> Iterator[None]:
    """An enqueuing process that raised its recursion and int-string limits."""
    recursion, digits = sys.getrecursionlimit(), sys.get_int_max_str_digits()
    sys.setrecursionlimit(20_000)
    sys.set_int_max_str_digits(0)  # no limit
    try:
        yield
    finally:
        sys.setrecursionlimit(recursion)
        sys.set_int_max_str_digits(digits)


@pytest.mark.parametrize(("payload", "where"), REFUSED)
def test_what_cannot_arrive_intact_is_refused_saying_where(
    queue: JobQueue, received: dict[int, Any], session: Session, payload: Any, where: str
) -> None:
    at = re.compile(re.escape(where) + r"($|[ ,:;])")
    with pytest.raises(PayloadError, match=at):
        queue.enqueue(session, "record", payload)
    with pytest.raises(PayloadError, match=at):
        queue.enqueue_many(session, "record", [{"ok": 1}, payload])
    assert session.execute(sa.text("SELECT 1")).scalar_one() == 1  # still usable


@pytest.mark.usefixtures("generous_process")
def test_the_limits_do_not_follow_the_enqueuing_process(
    queue: JobQueue, received: dict[int, Any], session: Session
) -> None:
    # The worker decodes with its own, default limits: a process that raised its own may not
    # enqueue what a worker could not read.
    with pytest.raises(PayloadError, match="nested too deeply"):
        queue.enqueue(session, "record", nested(5_000, 1))
    with pytest.raises(PayloadError, match=re.escape('payload["n"]')):
        queue.enqueue(session, "record", {"n": 10**INT_DIGITS})
    with pytest.raises(PayloadError, match=re.escape("payload[0]")):
        queue.enqueue_many(session, "record", [[10 ** (2 * INT_DIGITS)]])


@pytest.mark.usefixtures("received")
def test_refused_numbers_name_what_is_wrong(queue: JobQueue, session: Session) -> None:
    with pytest.raises(PayloadError, match=re.escape("-0.0")) as zero:
        queue.enqueue(session, "record", {"z": -0.0})
    with pytest.raises(PayloadError, match="4300") as digits:
        queue.enqueue(session, "record", {"n": 10**INT_DIGITS})
    assert "negative zero" in str(zero.value)
    assert "more than 4300 digits" in str(digits.value)
