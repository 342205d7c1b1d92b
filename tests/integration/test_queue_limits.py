"""Queue limits in the caller's transaction: the ops API, the plain claim and the limited claim.

Each test runs in a transaction that is rolled back, so its ``now()`` never moves: a lease
"expires" by moving the row's ``visible_at`` into the past, and the first seconds of a new cap
(when the limited claim recounts running jobs) end by moving ``recount_until``. The limited
claim is the worker's own (``LaneClaimer._claim_limited``, both statements), run in the test's
transaction. Commits, other sessions, clocks that move, and concurrency are in
tests/acceptance/test_limited_claim.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.orm import Session

from sa_jobqueue._sql import claim_limits, claiming, transitions
from sa_jobqueue.errors import InvalidLimitError
from sa_jobqueue.models import jobs_table, queues_table
from sa_jobqueue.ops import (
    QueueLimits,
    RateLimit,
    clear_queue_limits,
    list_queues,
    queue_limits,
    set_queue_concurrency,
    set_queue_key_concurrency,
    set_queue_key_rate,
    set_queue_rate,
)
from sa_jobqueue.worker._claimer import LaneClaimer
from tests.helpers.job_states import add_job
from tests.helpers.jobs import row
from tests.helpers.limited_claims import (
    InCaller,
    add_due,
    claim_limited,
    finish,
    limited_claimer,
    live,
)

j = jobs_table.c
q = queues_table.c
CLAIM_INDEX = "sa_jobqueue_jobs_claim_idx"
JOBS_PKEY = "sa_jobqueue_jobs_pkey"
QUEUES_PKEY = "sa_jobqueue_queues_pkey"


def claimed(conn: sa.Connection, queue: str, limit: int = 10) -> list[int]:
    params = {"from_queue": queue, "limit": limit, "worker": "plain"}
    return [r.id for r in conn.execute(claiming.claim(), params)]


def claimed_after(conn: sa.Connection, queue: str) -> list[int]:
    params = {"from_queue": queue, "limit": 10, "worker": "plain", "after_priority": -1,
              "after_visible_at": None, "after_id": 0}  # fmt: skip
    return [r.id for r in conn.execute(claiming.claim_after(), params)]


@pytest.fixture
def claimer(conn: sa.Connection) -> LaneClaimer:
    """The worker's limited claim, run in the test's transaction."""
    return limited_claimer(InCaller(conn))


def take(claimer: LaneClaimer, queue: str, limit: int = 10) -> list[int]:
    return [job.id for job in claim_limited(claimer, queue, limit)]


def holders_recorded(conn: sa.Connection, queue: str) -> None:
    """End the queue's recount period: its limited claims trust the recorded holders now."""
    conn.execute(
        sa.update(queues_table)
        .where(q.queue == queue)
        .values(recount_until=sa.func.now() - timedelta(seconds=1))
    )


@pytest.fixture
def statements(conn: sa.Connection) -> Iterator[list[str]]:
    """The SQL statements sent on ``conn`` while the test runs."""
    sent: list[str] = []

    def record(*args: Any) -> None:
        sent.append(args[2])

    event.listen(conn, "before_cursor_execute", record)
    yield sent
    event.remove(conn, "before_cursor_execute", record)


# -- 1. the ops API ----------------------------------------------------------------------------


def test_limits_set_and_cleared_return_what_was_there(conn: sa.Connection) -> None:
    five = RateLimit(5, timedelta(seconds=1))
    assert queue_limits(conn) == {}
    assert set_queue_concurrency(conn, "emails", 3) == QueueLimits()
    assert set_queue_rate(conn, "emails", "5/s") == QueueLimits(3, None)
    assert queue_limits(conn) == {"emails": QueueLimits(3, five)}
    assert set_queue_concurrency(conn, "emails", 7) == QueueLimits(3, five)
    assert set_queue_rate(conn, "reports", RateLimit(10, timedelta(minutes=5))) == QueueLimits()
    assert queue_limits(conn) == {
        "emails": QueueLimits(7, five),
        "reports": QueueLimits(None, RateLimit(10, timedelta(minutes=5))),
    }
    assert set_queue_rate(conn, "emails", None) == QueueLimits(7, five)
    assert clear_queue_limits(conn, "emails") == QueueLimits(7, None)
    assert clear_queue_limits(conn, "reports") == QueueLimits(
        None, RateLimit(10, timedelta(minutes=5))
    )
    assert clear_queue_limits(conn, "never-limited") == QueueLimits()
    assert queue_limits(conn) == {}


def test_limits_rolled_back_leave_nothing(session: Session) -> None:
    set_queue_concurrency(session, "kept", 2)
    session.commit()  # releases a savepoint of the test's transaction
    set_queue_concurrency(session, "emails", 3)
    set_queue_rate(session, "emails", "5/s")
    set_queue_rate(session, "kept", "1/h")
    clear_queue_limits(session, "kept")
    assert list(queue_limits(session)) == ["emails"]
    session.rollback()
    assert queue_limits(session) == {"kept": QueueLimits(2, None)}


def test_limits_are_seen_only_by_the_transaction_that_set_them(
    conn: sa.Connection, integration_engine: sa.Engine
) -> None:
    set_queue_concurrency(conn, "emails", 3)
    with integration_engine.connect() as other:
        assert queue_limits(other) == {}
        other.rollback()


@pytest.mark.parametrize("cap", [0, -1, True, False, 2**31, "x", "3", 1.5])
def test_a_bad_cap_is_refused_before_any_sql(
    conn: sa.Connection, statements: list[str], cap: object
) -> None:
    with pytest.raises(InvalidLimitError):
        set_queue_concurrency(conn, "emails", cap)  # type: ignore[arg-type]
    assert statements == []


@pytest.mark.parametrize(
    "rate", ["0/s", "5/", "5/fortnight", "/s", "5/0s", "5", "", "-5/s", "5/.s", 5, 2.5]
)
def test_a_bad_rate_is_refused_before_any_sql(
    conn: sa.Connection, statements: list[str], rate: object
) -> None:
    with pytest.raises(InvalidLimitError):
        set_queue_rate(conn, "emails", rate)  # type: ignore[arg-type]
    assert statements == []


@pytest.mark.parametrize(
    ("rate", "key"),
    [("5/s", None), ("5/s", ""), ("5/s", "x" * 201), ("5/s", 7), ("0/s", "customer"), (5, "c")],
)
def test_a_bad_rate_per_key_is_refused_before_any_sql(
    conn: sa.Connection, statements: list[str], rate: object, key: object
) -> None:
    with pytest.raises(InvalidLimitError):
        set_queue_key_rate(conn, "emails", rate, key=key)  # type: ignore[arg-type]
    assert statements == []


def test_a_queue_has_one_key_field_for_its_limits_per_key(conn: sa.Connection) -> None:
    per_second = RateLimit(10, timedelta(seconds=1))
    assert set_queue_key_rate(conn, "api", "10/s", key="customer") == QueueLimits()
    assert set_queue_key_concurrency(conn, "api", 2, key="customer") == QueueLimits(
        key_field="customer", key_rate=per_second
    )
    both = QueueLimits(None, None, 2, "customer", per_second)
    with pytest.raises(InvalidLimitError, match="limited per 'customer' already"):
        set_queue_key_rate(conn, "api", "1/s", key="account")
    with pytest.raises(InvalidLimitError, match="limited per 'customer' already"):
        set_queue_key_concurrency(conn, "api", 1, key="account")
    assert queue_limits(conn) == {"api": both}
    # Removing one keeps the field for the other; removing both removes it.
    assert set_queue_key_concurrency(conn, "api", None) == both
    assert queue_limits(conn) == {"api": QueueLimits(key_field="customer", key_rate=per_second)}
    assert set_queue_key_rate(conn, "api", None).key_rate == per_second
    assert queue_limits(conn) == {}
    # With neither left, another field is free to use.
    set_queue_key_concurrency(conn, "api", 1, key="account")
    assert queue_limits(conn) == {"api": QueueLimits(None, None, 1, "account")}


@pytest.mark.parametrize(
    ("limit", "period"),
    [
        (0, timedelta(seconds=1)),
        (2**31, timedelta(seconds=1)),
        (True, timedelta(seconds=1)),
        (5, timedelta(0)),
        (5, timedelta(microseconds=999)),
        (5, 1),
    ],
)
def test_a_bad_rate_limit_cannot_be_made(limit: Any, period: Any) -> None:
    with pytest.raises(InvalidLimitError):
        RateLimit(limit, period)


@pytest.mark.parametrize(
    ("text", "limit", "period", "shown"),
    [
        ("50/s", 50, timedelta(seconds=1), "50/1s"),
        ("50/second", 50, timedelta(seconds=1), "50/1s"),
        ("50/seconds", 50, timedelta(seconds=1), "50/1s"),
        ("50/sec", 50, timedelta(seconds=1), "50/1s"),
        (" 1000 / hour ", 1000, timedelta(hours=1), "1000/1h"),
        ("1000/h", 1000, timedelta(hours=1), "1000/1h"),
        ("10/5m", 10, timedelta(minutes=5), "10/5m"),
        ("10/5min", 10, timedelta(minutes=5), "10/5m"),
        ("10/90s", 10, timedelta(seconds=90), "10/90s"),
        ("3/1.5s", 3, timedelta(seconds=1.5), "3/1.5s"),
        ("7/250ms", 7, timedelta(milliseconds=250), "7/0.25s"),
        ("2/d", 2, timedelta(days=1), "2/1d"),
        ("2/2days", 2, timedelta(days=2), "2/2d"),
        ("60/M", 60, timedelta(minutes=1), "60/1m"),
    ],
)
def test_rate_texts_parse_and_print(text: str, limit: int, period: timedelta, shown: str) -> None:
    rate = RateLimit.parse(text)
    assert rate == RateLimit(limit, period)
    assert str(rate) == shown
    assert RateLimit.parse(str(rate)) == rate


def test_list_queues_shows_limits_use_and_what_holds_each_back(
    conn: sa.Connection, claimer: LaneClaimer
) -> None:
    add_due(conn, "capped", 4)
    add_due(conn, "rated", 4)
    add_due(conn, "roomy", 1)
    set_queue_concurrency(conn, "capped", 2)
    set_queue_rate(conn, "rated", "2/h")
    set_queue_concurrency(conn, "roomy", 5)
    set_queue_rate(conn, "unused", "9/s")  # limited before it has any job
    assert len(take(claimer, "capped")) == 2
    assert len(take(claimer, "rated")) == 2
    assert len(take(claimer, "roomy")) == 1
    found = {info.queue: info for info in list_queues(conn)}
    assert list(found) == ["capped", "rated", "roomy", "unused"]
    capped, rated, roomy, unused = found.values()
    assert (capped.limits, capped.running, capped.due, capped.rate_used) == (
        QueueLimits(2, None), 2, 2, 0
    )  # fmt: skip
    assert capped.held_back_by == ["at cap"]
    assert (rated.limits, rated.running, rated.rate_used) == (
        QueueLimits(None, RateLimit(2, timedelta(hours=1))), 2, 2
    )  # fmt: skip
    assert rated.held_back_by == ["rate limit"]
    assert (roomy.running, roomy.held_back_by) == (1, [])
    assert (unused.queued, unused.rate_used, unused.held_back_by) == (0, 0, [])
    assert unused.limits == QueueLimits(None, RateLimit(9, timedelta(seconds=1)))


# -- 2. the plain claim leaves limited queues alone ---------------------------------------------


@pytest.mark.parametrize("limit", ["cap", "rate", "both", "cap per key", "rate per key"])
def test_the_plain_claim_takes_nothing_from_a_limited_queue(
    conn: sa.Connection, limit: str
) -> None:
    held = add_job(conn, queue="limited")
    lost = add_job(conn, queue="limited", status="running", attempts=1, started_ago=60,
                   visible_in=-30)  # fmt: skip
    other = add_job(conn, queue="other")
    if limit in ("cap", "both"):
        set_queue_concurrency(conn, "limited", 100)
    if limit in ("rate", "both"):
        set_queue_rate(conn, "limited", "100/s")
    if limit == "cap per key":
        set_queue_key_concurrency(conn, "limited", 100, key="customer")
    if limit == "rate per key":
        set_queue_key_rate(conn, "limited", "100/s", key="customer")
    assert claimed(conn, "limited") == []
    assert claimed_after(conn, "limited") == []
    assert (row(conn, held).status, row(conn, lost).attempts) == ("queued", 1)
    assert claimed(conn, "other") == [other]
    # Its limits removed, the queue is the plain claim's again (the settings row stays).
    clear_queue_limits(conn, "limited")
    assert sorted(claimed(conn, "limited")) == sorted([held, lost])


# -- 3. the limited claim: cap, finishing, expired leases, recount ------------------------------


@pytest.mark.parametrize("recorded", [False, True], ids=["recounting", "recorded-holders"])
def test_a_cap_of_3_lets_3_run_and_one_more_when_one_finishes(
    conn: sa.Connection, claimer: LaneClaimer, recorded: bool
) -> None:
    add_due(conn, "capped", 10)
    set_queue_concurrency(conn, "capped", 3)
    first = claim_limited(claimer, "capped", 10)
    assert [job.status for job in first] == ["running"] * 3
    if recorded:
        holders_recorded(conn, "capped")
    assert sorted(conn.execute(sa.select(q.holders)).scalar_one()) == sorted(j.id for j in first)
    jobs, at_cap = claimer._claim_limited("capped", 10)
    assert (jobs, at_cap) == ([], True)
    assert finish(conn, first[:1]) == 1
    again = take(claimer, "capped", 10)
    assert len(again) == 1
    assert take(claimer, "capped", 10) == []
    assert live(conn, "capped") == 3
    assert sorted(conn.execute(sa.select(q.holders)).scalar_one()) == sorted(
        [job.id for job in first[1:]] + again
    )


def test_a_claim_asking_for_fewer_than_the_room_takes_what_it_asked(
    conn: sa.Connection, claimer: LaneClaimer
) -> None:
    add_due(conn, "capped", 10)
    set_queue_concurrency(conn, "capped", 3)
    assert len(take(claimer, "capped", 2)) == 2
    jobs, at_cap = claimer._claim_limited("capped", 2)
    assert (len(jobs), at_cap) == (1, True)  # the room (1) cut it short
    assert live(conn, "capped") == 3


@pytest.mark.parametrize("recorded", [False, True], ids=["recounting", "recorded-holders"])
def test_an_expired_lease_frees_its_slot_and_is_reclaimed_into_one(
    conn: sa.Connection, claimer: LaneClaimer, recorded: bool
) -> None:
    add_due(conn, "capped", 5)
    set_queue_concurrency(conn, "capped", 3)
    first = claim_limited(claimer, "capped", 10)
    assert len(first) == 3
    if recorded:
        holders_recorded(conn, "capped")
    # The worker holding the first job stopped renewing it: its lease ran out.
    lost = first[0].id
    conn.execute(
        sa.update(jobs_table)
        .where(j.id == lost)
        .values(visible_at=sa.func.now() - timedelta(seconds=1))
    )
    assert live(conn, "capped") == 2
    again = claim_limited(claimer, "capped", 10)
    # One slot was freed, and the lost job (due since its lease expired, before the two
    # queued ones) took it: a second attempt, counted, holding the slot.
    assert [(job.id, job.attempts, job.status) for job in again] == [(lost, 2, "running")]
    assert row(conn, lost).last_error["type"] == "LeaseExpired"
    assert live(conn, "capped") == 3
    assert take(claimer, "capped") == []


def test_jobs_running_before_the_cap_was_set_hold_its_slots(
    conn: sa.Connection, claimer: LaneClaimer
) -> None:
    running = [
        add_job(conn, queue="capped", status="running", attempts=1, started_ago=5, visible_in=60)
        for _ in range(5)
    ]
    add_due(conn, "capped", 5)
    set_queue_concurrency(conn, "capped", 3)
    jobs, at_cap = claimer._claim_limited("capped", 10)
    assert (jobs, at_cap) == ([], True)
    # The recount recorded them as holders: past the recount period they still count.
    assert sorted(conn.execute(sa.select(q.holders)).scalar_one()) == sorted(running)
    holders_recorded(conn, "capped")
    assert take(claimer, "capped") == []
    assert finish(conn, [row(conn, i) for i in running[:2]]) == 2
    assert take(claimer, "capped") == []  # 3 still run: at the cap
    assert finish(conn, [row(conn, running[2])]) == 1
    assert len(take(claimer, "capped")) == 1


def test_raising_a_cap_gives_room_at_once_and_lowering_it_stops_nothing(
    conn: sa.Connection, claimer: LaneClaimer
) -> None:
    add_due(conn, "capped", 10)
    set_queue_concurrency(conn, "capped", 2)
    assert len(take(claimer, "capped")) == 2
    set_queue_concurrency(conn, "capped", 5)
    assert len(take(claimer, "capped")) == 3
    set_queue_concurrency(conn, "capped", 1)
    assert take(claimer, "capped") == []
    assert live(conn, "capped") == 5


def test_a_rate_limit_in_one_window_allows_its_count_whatever_is_asked(
    conn: sa.Connection, claimer: LaneClaimer
) -> None:
    """One transaction: ``now()`` stays in one window, so the starts stop at exactly 5."""
    add_due(conn, "rated", 20)
    set_queue_rate(conn, "rated", "5/h")
    taken = [len(take(claimer, "rated", n)) for n in (2, 1, 10, 10)]
    assert taken == [2, 1, 2, 0]
    assert claimer.not_before["rated"] > 0
    (info,) = list_queues(conn)
    assert (info.rate_used, info.running) == (5, 5)


# -- 4. the cap per key: the order of a key's jobs ---------------------------------------------


def keyed_jobs(conn: sa.Connection, n: int, keys: int) -> list[int]:
    """``n`` jobs of queue ``keyed`` (``keys`` customers in turn), due since 10 s ago, under a
    cap of 1 per customer; their ids in enqueue order."""
    add_due(conn, "keyed", n, keys=keys)
    ten_ago = sa.func.now() - timedelta(seconds=10)
    ids = conn.execute(
        sa.update(jobs_table).where(j.queue == "keyed").values(visible_at=ten_ago).returning(j.id)
    ).scalars()
    set_queue_key_concurrency(conn, "keyed", 1, key="customer")
    return sorted(ids)


@pytest.fixture
def keyed_claimer(conn: sa.Connection) -> LaneClaimer:
    """The worker's limited claim of queue ``keyed`` (with its limits per key)."""
    return limited_claimer(InCaller(conn), keyed=("keyed",))


def test_a_cap_of_1_per_key_starts_each_keys_jobs_one_at_a_time_in_claim_order(
    conn: sa.Connection, keyed_claimer: LaneClaimer
) -> None:
    ids = keyed_jobs(conn, 6, keys=2)  # c0: ids 0, 2, 4; c1: ids 1, 3, 5
    first = claim_limited(keyed_claimer, "keyed", 10)
    assert [job.id for job in first] == ids[:2]
    assert take(keyed_claimer, "keyed") == []
    assert finish(conn, first[:1]) == 1
    assert take(keyed_claimer, "keyed") == [ids[2]]
    assert finish(conn, first[1:]) == 1
    assert take(keyed_claimer, "keyed") == [ids[3]]


@pytest.mark.parametrize("how", ["lease expired", "failed"])
def test_a_job_due_again_after_an_attempt_goes_behind_its_keys_next_jobs(
    conn: sa.Connection, keyed_claimer: LaneClaimer, how: str
) -> None:
    """Claim order is by due time, and a job whose attempt did not succeed is due again from
    its lease's end or its backoff's: after its key's jobs that were waiting. They start
    first, one at a time, and the job after them; its first attempt ran no handler, so the
    attempt that does is the only one its key's order sees."""
    ids = keyed_jobs(conn, 3, keys=1)
    (first,) = claim_limited(keyed_claimer, "keyed", 10)
    assert first.id == ids[0]
    if how == "lease expired":
        # Its worker stalled before the handler started; the lease ran out a second ago.
        conn.execute(
            sa.update(jobs_table)
            .where(j.id == first.id)
            .values(visible_at=sa.func.now() - timedelta(seconds=1))
        )
    else:
        # The attempt failed (before its handler did anything), retried with no backoff left.
        failed = {"job_id": first.id, "attempt": 1, "error": json.dumps({"message": "x"}),
                  "delay": 0}  # fmt: skip
        assert conn.execute(transitions.fail(), failed).one().status == "queued"
    order = []
    while again := claim_limited(keyed_claimer, "keyed", 10):
        assert len(again) == 1  # one at a time
        order.append((again[0].id, again[0].attempts))
        assert finish(conn, again) == 1
    assert order == [(ids[1], 1), (ids[2], 1), (ids[0], 2)]


def test_a_keyed_job_handed_back_unstarted_runs_first_again(
    conn: sa.Connection, keyed_claimer: LaneClaimer
) -> None:
    """A job handed back at shutdown before its handler started takes its place in its key's
    order again, its attempt uncounted: a rolling restart does not reorder a key's jobs."""
    ids = keyed_jobs(conn, 3, keys=1)
    (first,) = claim_limited(keyed_claimer, "keyed", 10)
    assert first.id == ids[0]
    assert first.visible_at is not None
    params = transitions.release_params([(first.id, first.attempts, first.visible_at)])
    assert conn.execute(transitions.release(), params).rowcount == 1
    order = []
    while again := claim_limited(keyed_claimer, "keyed", 10):
        order.append((again[0].id, again[0].attempts))
        assert finish(conn, again) == 1
    assert order == [(ids[0], 1), (ids[1], 1), (ids[2], 1)]


# -- 7. plans -----------------------------------------------------------------------------------


def _plan(conn: sa.Connection, statement: sa.ClauseElement, params: dict[str, Any]) -> Any:
    compiled = statement.compile(dialect=conn.dialect)
    text = "EXPLAIN (ANALYZE, FORMAT JSON) " + compiled.string
    (top,) = conn.exec_driver_sql(text, compiled.construct_params(params)).scalar_one()
    return top["Plan"]


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from _nodes(child)


@pytest.fixture
def history(conn: sa.Connection) -> sa.Connection:
    """5,000 finished jobs, 20 due ones in ``plain`` and 5,000 in ``backlog``, 1,000 paused
    queues, all analysed (a sequential scan of either table costs more than an index then)."""
    conn.execute(
        sa.text(
            "INSERT INTO sa_jobqueue_jobs (queue, task, payload, status, attempts, finished_at)"
            " SELECT 'plain', 'work', '{}', 'succeeded', 1, now() FROM generate_series(1, 5000)"
        )
    )
    add_due(conn, "plain", 20)
    add_due(conn, "backlog", 5000)  # another queue's: what a scan of the claim index would read
    # Settings rows of 1,000 other queues: a one-page table would be read whole, not probed.
    conn.execute(
        sa.text(
            "INSERT INTO sa_jobqueue_queues (queue, paused_at)"
            " SELECT 'q' || n, now() FROM generate_series(1, 1000) n"
        )
    )
    conn.exec_driver_sql("ANALYZE sa_jobqueue_jobs")
    conn.exec_driver_sql("ANALYZE sa_jobqueue_queues")
    return conn


def test_the_plain_claims_plan_keeps_its_shape(history: sa.Connection) -> None:
    """The limits add nothing to the plain claim's plan but the held-back probe: a One-Time
    Filter over an InitPlan that probes the queues table's primary key, then the claim index."""
    set_queue_concurrency(history, "capped", 3)  # a limited queue exists, not this one
    plan = _plan(history, claiming.claim(), {"from_queue": "plain", "limit": 5, "worker": "w"})
    described = json.dumps(plan, indent=1)
    assert plan["Actual Rows"] == 5, described
    nodes = list(_nodes(plan))
    filtered = [n for n in nodes if "One-Time Filter" in n]
    assert len(filtered) >= 1, described
    probes = [n for n in nodes if n.get("Relation Name") == "sa_jobqueue_queues"]
    assert len(probes) == 1, described
    assert probes[0]["Node Type"] in ("Index Scan", "Index Only Scan"), described
    assert probes[0]["Index Name"] == QUEUES_PKEY, described
    assert probes[0]["Parent Relationship"] == "InitPlan" or any(
        c.get("Parent Relationship") == "InitPlan" and probes[0] in list(_nodes(c))
        for n in nodes
        for c in n.get("Plans", [])
    ), described
    assert probes[0]["Actual Loops"] == 1, described
    (scan,) = [n for n in nodes if n.get("Index Name") == CLAIM_INDEX]
    assert scan["Actual Loops"] == 1, described
    assert not any(
        n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "sa_jobqueue_jobs" for n in nodes
    ), described


def _limited_plan(conn: sa.Connection, claimer: LaneClaimer, *, recorded: bool) -> Any:
    """The plan of a limited claim of 2 on ``plain`` (cap 10), 3 of its jobs running."""
    set_queue_concurrency(conn, "plain", 10)
    take(claimer, "plain", 3)
    if recorded:
        holders_recorded(conn, "plain")
    params = {"from_queue": "plain", "limit": 2, "worker": "w"}
    plan = _plan(conn, claim_limits.claim_limited(keyed=False), params)
    assert live(conn, "plain") == 5, json.dumps(plan, indent=1)
    return plan


@pytest.mark.parametrize("recorded", [False, True], ids=["recounting", "recorded-holders"])
def test_the_limited_claim_reads_no_more_jobs_than_it_touches(
    history: sa.Connection, claimer: LaneClaimer, recorded: bool
) -> None:
    """Like the plain claim, whose cost does not grow with finished history: each node that
    reads the jobs table produces a few rows (the picked, the claimed), never the 5,000
    finished jobs or the 5,000 queued in another queue. (The holders are counted inside
    ``sa_jobqueue_lock_queue``, whose plans EXPLAIN does not show.) With the claimed rows
    joined to the picked ones as ``id = picked.id``, the planner read the whole table."""
    plan = _limited_plan(history, claimer, recorded=recorded)
    described = json.dumps(plan, indent=1)
    reads = [
        (n["Node Type"], n.get("Index Name"), int(n["Actual Rows"]) * int(n["Actual Loops"]))
        for n in _nodes(plan)
        if n.get("Relation Name") == "sa_jobqueue_jobs" and n["Node Type"] != "ModifyTable"
    ]
    assert reads, described
    assert max(rows for _, _, rows in reads) <= 10, (reads, described)
    assert all(index in (CLAIM_INDEX, JOBS_PKEY) for _, index, _ in reads), (reads, described)
