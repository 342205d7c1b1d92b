"""Payloads reach the handler exactly as enqueued, or enqueue refuses them, against PostgreSQL.

"Exactly" means equal (``==``) and of the same type (``type() is``) at every level, floats
bit for bit. jsonb is where that is at risk: its numbers are ``numeric``, which keeps digits but
not Python's types, so ``1e16`` used to come back as the int 10000000000000000 and ``-0.0`` as
``0.0``. Each case is enqueued through every entry point (``enqueue`` and ``enqueue_many`` on a
Session, ``aenqueue`` and ``aenqueue_many`` on an AsyncSession, a periodic schedule's job) and
run by a real worker (``sa_jobqueue.testing.drain``), and what the handler received is compared
with what was sent. What cannot arrive intact is refused at enqueue with a PayloadError that
says where it is.
"""

from __future__ import annotations

import asyncio
import re
import sys
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from sa_jobqueue import JobContext, JobQueue
from sa_jobqueue.errors import PayloadError
from sa_jobqueue.periodic import enqueue_due
from sa_jobqueue.testing import drain
from tests.helpers.periodic import YEARLY, rewind

#: The documented nesting limit: a payload may hold containers this many levels deep.
DEPTH = 200
#: Python's default limit on the digits of an int converted to or from text.
INT_DIGITS = 4300
BIGGEST_FLOAT = sys.float_info.max  # 1.7976931348623157e308


def nested(depth: int, leaf: Any) -> Any:
    """``leaf`` inside ``depth`` containers, lists and dicts by turns."""
    value = leaf
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


def assert_same(sent: Any, got: Any, path: str = "payload") -> None:
    """Equal and of the same type at every level; floats compared bit for bit (their repr)."""
    assert type(got) is type(sent), f"{path}: sent {type(sent).__name__}, got {type(got)}"
    if isinstance(sent, dict):
        assert list(sorted(got)) == list(sorted(sent)), f"{path}: keys differ"
        for key in sent:
            assert_same(sent[key], got[key], f"{path}[{key!r}]")
    elif isinstance(sent, list):
        assert len(got) == len(sent), f"{path}: length differs"
        for index, (a, b) in enumerate(zip(sent, got, strict=True)):
            assert_same(a, b, f"{path}[{index}]")
    elif isinstance(sent, float):
        assert repr(got) == repr(sent), f"{path}: sent {sent!r}, got {got!r}"
    else:
        assert got == sent, f"{path}: sent {sent!r}, got {got!r}"


@pytest.fixture
def received(queue: JobQueue) -> dict[int, Any]:
    """What the ``record`` task's handler was given, by job id."""
    seen: dict[int, Any] = {}

    @queue.task
    def record(ctx: JobContext, payload: Any) -> None:
        seen[ctx.job_id] = payload

    return seen


def enqueue_everywhere(
    queue: JobQueue, engine: sa.Engine, url: URL, payloads: list[Any]
) -> dict[int, Any]:
    """Enqueue each payload through the four entry points; return {job id: payload sent}."""
    sent: dict[int, Any] = {}
    with Session(engine) as session, session.begin():
        for payload in payloads:
            sent[queue.enqueue(session, "record", payload)] = payload
        sent.update(zip(queue.enqueue_many(session, "record", payloads), payloads, strict=True))

    async def from_async() -> None:
        async_engine = create_async_engine(url)
        try:
            async with AsyncSession(async_engine) as session, session.begin():
                for payload in payloads:
                    sent[await queue.aenqueue(session, "record", payload)] = payload
                ids = await queue.aenqueue_many(session, "record", payloads)
                sent.update(zip(ids, payloads, strict=True))
        finally:
            await async_engine.dispose()

    asyncio.run(from_async())
    return sent


def run_and_compare(
    queue: JobQueue, engine: sa.Engine, sent: dict[int, Any], received: dict[int, Any]
) -> None:
    result = drain(queue, engine)
    assert (result.failed, result.dead, result.errors) == (0, 0, {})
    assert result.succeeded == len(sent)
    for job_id, payload in sent.items():
        assert_same(payload, received[job_id], f"job {job_id}: payload")


# -- what arrives intact --------------------------------------------------------------------

PRESERVED = [
    # Floats from 1e16 up are written by Python with an exponent, which numeric used to turn
    # into an integer; below it, and for small magnitudes, the text has a decimal point.
    pytest.param(1e16, id="1e16"),
    pytest.param(-1e16, id="minus-1e16"),
    pytest.param(9999999999999998.0, id="largest-float-below-1e16"),
    pytest.param(10000000000000002.0, id="next-float-above-1e16"),
    pytest.param(1.5e16, id="1.5e16"),
    pytest.param(2.0**53, id="2**53"),
    pytest.param(2.0**64, id="2**64"),
    pytest.param(1e22, id="1e22"),
    pytest.param(1.2345678901234567e300, id="1.2345678901234567e300"),
    pytest.param(BIGGEST_FLOAT, id="largest-float"),
    pytest.param(-BIGGEST_FLOAT, id="most-negative-float"),
    pytest.param(sys.float_info.min, id="smallest-normal-float"),
    pytest.param(5e-324, id="smallest-subnormal-float"),
    pytest.param(-5e-324, id="minus-smallest-subnormal-float"),
    pytest.param(1e-7, id="1e-7"),
    pytest.param(1e-5, id="1e-5"),
    pytest.param(0.1, id="0.1"),
    pytest.param(0.0, id="zero"),
    pytest.param(1.0, id="one"),
    pytest.param(123456789.125, id="exact-binary-fraction"),
    # Integers, up to the longest a worker can decode with Python's default limit.
    pytest.param(0, id="int-zero"),
    pytest.param(2**63, id="2**63"),
    pytest.param(-(2**63) - 1, id="below-bigint"),
    pytest.param(10**INT_DIGITS - 1, id="int-of-4300-digits"),
    pytest.param(-(10**INT_DIGITS - 1), id="negative-int-of-4300-digits"),
    # Text that looks like the numbers above stays text.
    pytest.param(["1e+16", "-0.0", "1e16", "10000000000000000"], id="numbers-as-strings"),
    pytest.param({"1e+16": 1e16, "-0.0": 0.0}, id="numbers-as-keys"),
    pytest.param(True, id="true"),
    pytest.param(None, id="none"),
]


@pytest.mark.parametrize("value", PRESERVED)
def test_boundary_values_arrive_exactly_as_sent(
    queue: JobQueue,
    received: dict[int, Any],
    engine: sa.Engine,
    database_url: URL,
    value: Any,
) -> None:
    # The same value at the top, in a flat dict, and nested: enqueue's checks take a shortcut
    # for flat dicts, so each shape is its own case.
    payloads = [value, {"v": value, "n": 1}, {"a": [1, "x", {"b": [value, value]}]}]
    sent = enqueue_everywhere(queue, engine, database_url, payloads)
    run_and_compare(queue, engine, sent, received)


def test_a_payload_at_the_depth_limit_arrives_intact(
    queue: JobQueue, received: dict[int, Any], engine: sa.Engine, database_url: URL
) -> None:
    payloads = [nested(DEPTH, 1e300), nested(DEPTH - 1, [1e16]), nested(DEPTH, "leaf")]
    sent = enqueue_everywhere(queue, engine, database_url, payloads)
    run_and_compare(queue, engine, sent, received)


def test_a_large_mixed_payload_arrives_intact(
    queue: JobQueue, received: dict[int, Any], engine: sa.Engine, database_url: URL
) -> None:
    payload = {
        "floats": [float(f"1.{i}e{e}") for i in range(1, 10) for e in range(-320, 309, 17)],
        "ints": [10**e for e in range(0, 400, 7)],
        "text": 'naïve ☃ \U0001f600 "quoted" \\ e+16 -0.0',
        "": [{}, [], None, False, {"deep": [[1e16]]}],
    }
    sent = enqueue_everywhere(queue, engine, database_url, [payload])
    run_and_compare(queue, engine, sent, received)


def test_a_periodic_jobs_payload_arrives_intact(engine: sa.Engine) -> None:
    queue = JobQueue()
    seen: list[Any] = []
    declared = {"big": 1e16, "max": BIGGEST_FLOAT, "tiny": [5e-324]}

    @queue.periodic(YEARLY, payload=declared, name="fidelity")
    @queue.task
    def report(ctx: JobContext, payload: Any) -> None:
        seen.append(payload)

    assert enqueue_due(engine, queue) == 0  # first sight: registers the schedule
    rewind(engine, "fidelity")
    assert enqueue_due(engine, queue) == 1
    drain(queue, engine)
    (got,) = seen
    assert_same({**declared, "tick": got["tick"]}, got)


# -- what is refused, and where -------------------------------------------------------------


def test_the_async_enqueue_refuses_the_same(
    queue: JobQueue, received: dict[int, Any], database_url: URL
) -> None:
    async def scenario() -> None:
        async_engine = create_async_engine(database_url)
        try:
            async with AsyncSession(async_engine) as session:
                with pytest.raises(PayloadError, match=re.escape('payload["a"][1]')):
                    await queue.aenqueue(session, "record", {"a": [1, -0.0]})
                with pytest.raises(PayloadError, match=re.escape('payload["b"]')):
                    await queue.aenqueue_many(session, "record", [{"b": 10**INT_DIGITS}])
        finally:
            await async_engine.dispose()

    asyncio.run(scenario())
