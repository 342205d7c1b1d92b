"""The plain claim sent as text (``HeldConnection.rows(..., as_text=True)``) is the same claim.

It skips SQLAlchemy's compiling and result types on an idle worker's pickup path, and on a
worker's own statements' engine behind no transaction pooler SQLAlchemy's execution too (it goes
to the driver). It must keep the rows as ``execute`` reads them, the client-side deadline, what
the engine's error hooks see of a driver error, and behind a transaction pooler the settings
applied in the claim's own transaction and gone after it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL

from sa_jobqueue._deadlines import guard_statements
from sa_jobqueue._pooler import on_prepared_statement_clash
from sa_jobqueue._sql import claiming
from sa_jobqueue.database import CONTROL_SETTINGS, HeldConnection, Pooler, create_engine
from sa_jobqueue.worker._claimed import Claimed

QUEUE = "as-text"
INSERT = sa.text(
    "INSERT INTO sa_jobqueue_jobs (queue, task, payload, priority, lease, trace_context, backoff)"
    " VALUES (:queue, 'noop', '{\"n\": [1, 2.5, \"x\"]}', 3, interval '42 seconds',"
    ' \'{"traceparent": "00-ab-cd-01"}\', \'{"base": 1.5, "cap": 60}\')'
)
PARAMS = {"from_queue": QUEUE, "limit": 5, "worker": "w"}


def _single(url: URL, pooler: Pooler) -> tuple[sa.Engine, sa.Engine]:
    """A control engine, and the engine for a worker's own statements made of it as
    ``Worker`` makes it."""
    engine = create_engine(url, pooler=pooler, settings=CONTROL_SETTINGS)
    single = engine.execution_options(isolation_level="AUTOCOMMIT")
    guard_statements(single)
    return engine, single


@pytest.fixture
def single(database_url: URL) -> Iterator[sa.Engine]:
    engine, single = _single(database_url, "session")
    yield single
    engine.dispose()


def _enqueue(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        conn.execute(INSERT, {"queue": QUEUE})


def _claim(held: HeldConnection, *, as_text: bool) -> Claimed:
    rows = held.rows(claiming.claim(), PARAMS, as_text=as_text)
    assert len(rows) == 1
    return Claimed.of(rows[0])


def test_a_claim_sent_as_text_reads_as_the_same_claim_through_execute(
    single: sa.Engine,
) -> None:
    held = HeldConnection(single)
    try:
        _enqueue(single)
        by_text = _claim(held, as_text=True)
        _enqueue(single)
        by_execute = _claim(held, as_text=False)
    finally:
        held.close()
    assert by_text.id != by_execute.id
    same = {"id": 0, "created_at": None, "visible_at": None}
    assert replace(by_text, **same) == replace(by_execute, **same)  # type: ignore[arg-type]
    for name in ("lease", "trace_context", "backoff", "created_at", "visible_at", "payload"):
        assert type(getattr(by_text, name)) is type(getattr(by_execute, name)), name
    assert by_text.status == "running"
    assert by_text.trace_context == {"traceparent": "00-ab-cd-01"}
    assert by_text.backoff == {"base": 1.5, "cap": 60}


def test_a_claim_sent_as_text_is_armed_with_the_statement_deadline(single: sa.Engine) -> None:
    """The deadline rides on the engine's cursor events: the text must pass through them."""
    from sa_jobqueue import _deadlines

    armed: list[float] = []
    arm = _deadlines.DEADLINES.arm

    def counted(fd: int, seconds: float, clock: Any = None) -> int:
        armed.append(seconds)
        return arm(fd, seconds, clock)

    held = HeldConnection(single)
    _enqueue(single)
    # Connected first (its connect and checkout are armed with the ping's deadline).
    assert held.rows(claiming.claim(), {**PARAMS, "from_queue": "none"}, as_text=True) == []
    _deadlines.DEADLINES.arm = counted  # type: ignore[method-assign]
    try:
        _claim(held, as_text=True)
    finally:
        _deadlines.DEADLINES.arm = arm  # type: ignore[method-assign]
        held.close()
    assert armed == [_deadlines.STATEMENT_DEADLINE]


def test_behind_a_transaction_pooler_a_claim_sent_as_text_has_its_settings_for_itself(
    database_url: URL,
) -> None:
    """Behind a transaction pooler the settings are applied in each statement's transaction
    (``_pooler.set_local_in_every_transaction``): the claim sent as text gets them, and the
    server connection the pooler hands on keeps none of them."""
    engine, single = _single(database_url, "transaction")
    seen: list[str] = []

    # On the control engine, after the pooler's own listener: inside the transaction it
    # began for the claim.
    @event.listens_for(engine, "before_cursor_execute")
    def inside(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if statement.startswith("WITH picked"):
            seen.append(cursor.connection.execute("SHOW statement_timeout").fetchone()[0])

    held = HeldConnection(single)
    try:
        _enqueue(single)
        _claim(held, as_text=True)
        assert seen == [CONTROL_SETTINGS["statement_timeout"]]
        raw = held._conn.connection.dbapi_connection  # type: ignore[union-attr]
        assert raw.info.transaction_status == 0  # idle: the claim's transaction committed
        assert raw.execute("SHOW statement_timeout").fetchone()[0] == "0"
    finally:
        held.close()
        engine.dispose()


def test_a_claim_sent_as_text_goes_to_the_driver_past_the_execution_events(
    single: sa.Engine,
) -> None:
    seen: list[str] = []

    @event.listens_for(single, "before_cursor_execute")
    def record(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        seen.append(statement)

    held = HeldConnection(single)
    try:
        _enqueue(single)
        _claim(held, as_text=True)
        assert not [s for s in seen if s.startswith("WITH picked")]
        _enqueue(single)
        _claim(held, as_text=False)
        assert [s for s in seen if s.startswith("WITH picked")]
    finally:
        held.close()


def test_a_driver_error_meets_the_engine_error_hooks_as_a_pooler_clash_does(
    single: sa.Engine,
) -> None:
    """The claim's prepared statement dropped under it, as a transaction pooler that hands on
    another server connection does: the claim goes again through SQLAlchemy on the same
    connection, meets the same error, and the engine's error hooks see the clash (on which the
    worker stops and says what to pass)."""
    clashes: list[None] = []
    on_prepared_statement_clash(single, lambda: clashes.append(None))
    held = HeldConnection(single)
    try:
        for _ in range(6):  # psycopg prepares a statement at its 5th run
            _enqueue(single)
            _claim(held, as_text=True)
        driver = held._conn.connection.driver_connection  # type: ignore[union-attr]
        # Past psycopg, which would forget its prepared statements on a DEALLOCATE of its own.
        driver.pgconn.exec_(b"DEALLOCATE ALL")
        _enqueue(single)
        with pytest.raises(sa.exc.ProgrammingError, match="does not exist"):
            held.rows(claiming.claim(), PARAMS, as_text=True)
        assert clashes == [None]  # the hook saw it, once
    finally:
        held.close()
