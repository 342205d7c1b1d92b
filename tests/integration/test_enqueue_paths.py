"""How enqueue reaches the database: round trips, INSERT or COPY, straight to psycopg or not.

One job is one INSERT, sent to psycopg directly unless something listens to SQLAlchemy's
events; a batch of ``COPY_FROM`` jobs or more without unique keys goes in by COPY after one
statement that draws its ids. Whatever the path, the rows must be the same, and the ids come
back in the payloads' order. Round trips are counted in libpq's protocol trace (see
tests/helpers/protocol.py), on an engine of the test's own that prepares no statements, so
that psycopg's one-off preparing round trip cannot make a count vary.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from opentelemetry.sdk.trace import TracerProvider
from sqlalchemy import select
from sqlalchemy.orm import Session

from sa_jobqueue import Backoff, JobQueue
from sa_jobqueue._driver import _CURSOR, _driver_text
from sa_jobqueue._enqueue import inserting
from sa_jobqueue._sql import enqueue as enqueue_sql
from sa_jobqueue.database import create_engine
from sa_jobqueue.errors import PayloadError
from sa_jobqueue.models import jobs_table
from tests.helpers.jobs import handler
from tests.helpers.notify import recording
from tests.helpers.protocol import pgconn_of, traced

j = jobs_table.c


@pytest.fixture
def queue() -> JobQueue:
    queue = JobQueue(default_queue="paths")
    queue.task(name="plain")(handler)
    queue.task(name="keyed", unique_key=lambda payload: str(payload["k"]))(handler)
    return queue


@pytest.fixture
def own(integration_engine: sa.Engine) -> Iterator[sa.Connection]:
    """A connection of an engine that prepares no statements, in a transaction rolled back."""
    engine = create_engine(integration_engine.url, connect_args={"prepare_threshold": None})
    try:
        with engine.connect() as connection:
            transaction = connection.begin()
            yield connection
            transaction.rollback()
    finally:
        engine.dispose()


@pytest.fixture
def sent_sql(own: sa.Connection) -> Iterator[list[str]]:
    """Every statement ``own``'s engine sends through SQLAlchemy's execute."""
    yield from recording(own.engine)


def rows(conn: sa.Connection, ids: list[int]) -> list[dict[str, Any]]:
    """The jobs' rows in the order of ``ids``, every column but the id."""
    found = {
        r.id: {key: value for key, value in r._mapping.items() if key != "id"}
        for r in conn.execute(select(jobs_table).where(j.id.in_(ids)))
    }
    return [found[i] for i in ids]


def lease_texts(conn: sa.Connection, ids: list[int]) -> list[str]:
    """The leases as PostgreSQL writes them: "24:00:00" and "1 day" differ as text only."""
    text = sa.cast(j.lease, sa.Text)
    found = dict(conn.execute(select(j.id, text).where(j.id.in_(ids))).all())
    return [found[i] for i in ids]


@pytest.fixture
def copy_from(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``copy_from(n)``: batches of ``n`` jobs or more go in by COPY for the rest of the test."""

    def set_threshold(n: int) -> None:
        monkeypatch.setattr(inserting, "COPY_FROM", n)

    return set_threshold


# -- round trips ---------------------------------------------------------------------------------


def test_an_enqueue_in_an_open_transaction_is_one_round_trip(
    own: sa.Connection, queue: JobQueue
) -> None:
    own.execute(sa.text("SELECT 1"))  # the transaction has begun and done work
    with traced(pgconn_of(own)) as first:
        woke = queue.enqueue(own, "plain", {"n": 1})
    with traced(pgconn_of(own)) as second:
        again = queue.enqueue(own, "plain", {"n": 2})
    assert first.round_trips == 1
    assert "pg_notify" in first.queries[0]  # the wake-up rides in the INSERT
    assert second.round_trips == 1
    assert "pg_notify" not in second.queries[0]  # sent once per transaction
    assert (woke.created, again.created, again > woke) == (True, True, True)


def test_an_enqueue_in_a_session_is_one_round_trip(own: sa.Connection, queue: JobQueue) -> None:
    with Session(bind=own, join_transaction_mode="create_savepoint") as session:
        session.execute(sa.text("SELECT 1"))
        with traced(pgconn_of(own)) as traffic:
            queue.enqueue(session, "plain", {"n": 1})
            queue.enqueue(session, "plain", {"n": 2})
    assert traffic.round_trips == 2


def test_an_enqueue_goes_through_sqlalchemy_when_something_listens(
    own: sa.Connection, queue: JobQueue, sent_sql: list[str]
) -> None:
    own.execute(sa.text("SELECT 1"))
    before = len(sent_sql)
    with traced(pgconn_of(own)) as traffic:
        queue.enqueue(own, "plain", {"n": 1})
    statements = sent_sql[before:]
    assert len(statements) == 1  # seen by the listener: it went through SQLAlchemy's execute
    assert statements[0].startswith("INSERT")
    assert "pg_notify" in statements[0]
    assert traffic.round_trips == 1


def _direct(conn: sa.Connection) -> bool:
    """Whether an enqueue on ``conn`` went straight to psycopg: only that path keeps a cursor
    in the pooled connection's ``info``."""
    return _CURSOR in conn.connection.info


def _listened(conn: sa.Connection) -> sa.Connection:
    sa.event.listen(conn, "before_execute", lambda *args: None)
    return conn


# What pushes an enqueue off the direct path, each alone: SQLAlchemy's execute then has work
# only it can do (echo, a schema map, a listener of the connection's events).
GUARDS = {
    "none": (False, lambda conn: conn),
    "echo": (True, lambda conn: conn),
    "schema_translate_map": (False, lambda conn: conn.execution_options(schema_translate_map={})),
    "a listener": (False, _listened),
}


@pytest.mark.parametrize("guard", GUARDS)
def test_each_guard_sends_the_enqueue_through_sqlalchemy_in_one_round_trip(
    integration_engine: sa.Engine, queue: JobQueue, guard: str
) -> None:
    echo, configure = GUARDS[guard]
    engine = create_engine(
        integration_engine.url, echo=echo, connect_args={"prepare_threshold": None}
    )
    try:
        with engine.connect() as own, own.begin():
            conn = configure(own)
            conn.execute(sa.text("SELECT 1"))
            with traced(pgconn_of(conn)) as traffic:
                job = queue.enqueue(conn, "plain", {"n": 1})
            assert _direct(conn) is (guard == "none")
            assert traffic.round_trips == 1
            assert conn.execute(select(j.payload).where(j.id == job)).scalar_one() == {"n": 1}
            own.rollback()
    finally:
        engine.dispose()


def test_an_enqueue_in_an_inactive_transaction_raises_as_sqlalchemy_would(
    integration_engine: sa.Engine, queue: JobQueue
) -> None:
    # Only SQLAlchemy's execute can say why the transaction cannot be used.
    with integration_engine.connect() as conn:
        transaction = conn.begin()
        conn.execute(sa.text("SELECT 1"))
        conn.invalidate()
        with pytest.raises(sa.exc.PendingRollbackError):
            queue.enqueue(conn, "plain", {"n": 1})
        transaction.rollback()


def test_a_small_batch_is_one_round_trip_and_a_large_one_three(
    own: sa.Connection, queue: JobQueue
) -> None:
    own.execute(sa.text("SELECT 1"))
    with traced(pgconn_of(own)) as small:
        queue.enqueue_many(own, "plain", [{"n": n} for n in range(inserting.COPY_FROM - 1)])
    with traced(pgconn_of(own)) as large:
        queue.enqueue_many(own, "plain", [{"n": n} for n in range(inserting.COPY_FROM)])
    assert small.round_trips == 1
    assert small.queries[0].startswith("INSERT")
    # The statement that draws the ids, then COPY: its start, then its data and end.
    assert large.round_trips == 3
    assert "nextval" in large.queries[0]
    assert large.queries[1].startswith("COPY")
    assert "CopyData" in large.messages


def test_the_single_inserts_are_sent_as_sqlalchemy_would(own: sa.Connection) -> None:
    # The direct path needs no conversion of values by SQLAlchemy: if a statement ever needed
    # one, its driver text would be None and enqueue would quietly take the slower path.
    for schedule in ("now", "at", "after"):
        for flags in range(16):
            wake, unique, traced_, backoff = (bool(flags & bit) for bit in (1, 2, 4, 8))
            statement = enqueue_sql.insert_job(schedule, wake, unique, traced_, backoff)
            text = _driver_text(statement, own.dialect)
            assert text is not None, (schedule, wake, unique, traced_, backoff)
            # SQLAlchemy's text with its named placeholders by position, in the text's order.
            named = text.text.replace("%s", "{}").format(*(f"%({n})s" for n in text.names))
            assert named == str(statement.compile(dialect=own.dialect))
            assert not text.constants  # the statement's own values are written in its text


# -- COPY and INSERT write the same rows ----------------------------------------------------------

SCHEDULES = {
    "now": None,
    "at": datetime(2031, 7, 4, 9, 30, 15, 123456, tzinfo=UTC),
    "after": timedelta(days=2, seconds=3, microseconds=7),
}


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("options", ["defaults", "overridden"])
def test_copy_and_insert_write_the_same_rows(
    conn: sa.Connection, queue: JobQueue, copy_from: Any, schedule: str, options: str
) -> None:
    given: dict[str, Any] = {"run_at": SCHEDULES[schedule]}
    if options == "overridden":
        given |= {
            "priority": -7,
            "queue": "elsewhere",
            "max_attempts": 9,
            # A day of lease is 24 hours, not "1 day": the same interval text by either path.
            "lease": timedelta(days=1),
            "backoff": Backoff(base=timedelta(seconds=3), cap=timedelta(minutes=2), jitter=0.5),
        }
    payloads = [{"n": n, "tag": f"t{n}"} for n in range(5)]
    copy_from(10**9)
    inserted = queue.enqueue_many(conn, "plain", payloads, **given)
    copy_from(1)
    copied = queue.enqueue_many(conn, "plain", payloads, **given)
    assert copied == sorted(copied)
    assert min(copied) > max(inserted)
    # One transaction: now() is the same for both, so even created_at and visible_at agree.
    assert rows(conn, copied) == rows(conn, inserted)
    assert lease_texts(conn, copied) == lease_texts(conn, inserted)
    assert [r["payload"] for r in rows(conn, copied)] == payloads


def test_copy_and_insert_carry_the_same_trace_context(conn: sa.Connection, copy_from: Any) -> None:
    queue = JobQueue(tracing=True)
    queue.task(name="plain")(handler)
    tracer = TracerProvider().get_tracer("tests")
    with tracer.start_as_current_span("request"):
        copy_from(10**9)
        inserted = queue.enqueue_many(conn, "plain", [1, 2])
        copy_from(1)
        copied = queue.enqueue_many(conn, "plain", [1, 2])
    stored = rows(conn, copied)
    assert stored == rows(conn, inserted)
    assert stored[0]["trace_context"]["traceparent"].startswith("00-")


# Characters COPY's text format escapes (tab, newline, carriage return, backslash), its NULL
# marker and end-of-data line as text, and characters beyond ASCII: every one must come back.
AWKWARD = [
    "tab\there",
    "new\nline",
    "carriage\rreturn",
    "back\\slash",
    "\\N",
    "\\.",
    "end\\",
    'quote " and \\" both',
    "\x01\x1f\x7f",
    "é, 中文, 🎉, e\u0301",
    "\u2028\u2029",
    "",
]


@pytest.mark.parametrize("path", ["insert", "copy"])
def test_awkward_payloads_round_trip_exactly(
    conn: sa.Connection, queue: JobQueue, copy_from: Any, path: str
) -> None:
    copy_from(1 if path == "copy" else 10**9)
    payloads: list[Any] = [{"s": s, s: [s]} for s in AWKWARD if s] + AWKWARD
    ids = queue.enqueue_many(conn, "plain", payloads)
    assert [r["payload"] for r in rows(conn, ids)] == payloads
    as_text = dict(
        conn.execute(select(j.id, sa.cast(j.payload, sa.Text)).where(j.id.in_(ids))).all()
    )
    assert [json.loads(as_text[i]) for i in ids] == payloads


@pytest.mark.parametrize("path", ["insert", "copy"])
def test_a_nul_character_is_refused_before_any_sql(
    conn: sa.Connection, queue: JobQueue, copy_from: Any, path: str, sent_sql: list[str]
) -> None:
    copy_from(1 if path == "copy" else 10**9)
    with pytest.raises(PayloadError, match="NUL"):
        queue.enqueue_many(conn, "plain", [{"ok": 1}, {"bad": "a\x00b"}])
    assert queue.enqueue_many(conn, "plain", [{"ok": 1}])  # the transaction is still usable


def test_a_large_batch_with_unique_keys_is_inserted_and_dedupes(
    conn: sa.Connection, queue: JobQueue
) -> None:
    size = inserting.COPY_FROM * 2
    held = queue.enqueue(conn, "keyed", {"k": 0})
    jobs = queue.enqueue_many(conn, "keyed", [{"k": n % (size // 2)} for n in range(size)])
    assert jobs[0] == held
    assert not jobs[0].created
    assert all(job.created for job in jobs[1 : size // 2])
    assert jobs[size // 2 :] == jobs[: size // 2]
    assert not any(job.created for job in jobs[size // 2 :])
    live = conn.execute(
        select(sa.func.count()).where(j.task == "keyed", j.status == "queued")
    ).scalar_one()
    assert live == size // 2
