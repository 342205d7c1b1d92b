"""``ops.bulk``: cancel, retry, delete and run now, by ids or by filter, one batch per call.

In a transaction rolled back after each test; each test's jobs sit in queues of their own,
since the tier's database is shared.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa

from sa_jobqueue.errors import InvalidJobError
from sa_jobqueue.models import dependencies_table, jobs_table
from sa_jobqueue.ops.bulk import (
    BulkBatch,
    cancel_jobs,
    count_matching,
    delete_jobs,
    retry_jobs,
    run_jobs_now,
)
from sa_jobqueue.ops.filters import MAX_IDS
from tests.helpers.job_states import add_dead, add_job

j = jobs_table.c


def statuses(conn: sa.Connection, *ids: int) -> list[str | None]:
    found = dict(conn.execute(sa.select(j.id, j.status).where(j.id.in_(ids))).all())
    return [found.get(i) for i in ids]


def test_cancel_by_ids_cancels_waiting_and_queued_requests_running_leaves_finished(
    conn: sa.Connection,
) -> None:
    queued = add_job(conn, queue="bk-c")
    running = add_job(conn, queue="bk-c", status="running", attempts=1, started_ago=1)
    waiting = add_job(conn, queue="bk-c", status="waiting")
    done = add_job(conn, queue="bk-c", status="succeeded", attempts=1)

    batch = cancel_jobs(conn, ids=[queued, running, waiting, done, queued])

    assert batch == BulkBatch(done=2, requested=1, left=1, more=False)
    assert statuses(conn, queued, running, waiting, done) == [
        "cancelled",
        "running",
        "cancelled",
        "succeeded",
    ]
    flag = sa.select(j.cancel_requested).where(j.id == running)
    assert conn.execute(flag).scalar_one() is True


def test_cancel_settles_what_waits_for_the_cancelled_job(conn: sa.Connection) -> None:
    first = add_job(conn, queue="bk-s")
    after = add_job(conn, queue="bk-s", status="waiting")
    edge = {"job_id": after, "depends_on": first, "on_failure": "cancel", "pending": True}
    conn.execute(sa.insert(dependencies_table).values(edge))

    assert cancel_jobs(conn, queue="bk-s").done == 1

    assert statuses(conn, first, after) == ["cancelled", "cancelled"]


def test_cancel_by_filter_batches_and_leaves_other_queues(conn: sa.Connection) -> None:
    mine = [add_job(conn, queue="bk-f", task="t.a") for _ in range(5)]
    other_task = add_job(conn, queue="bk-f", task="t.b")
    other_queue = add_job(conn, queue="bk-g", task="t.a")

    first = cancel_jobs(conn, queue="bk-f", task="t.a", batch=3)
    second = cancel_jobs(conn, queue="bk-f", task="t.a", batch=3)

    assert (first.done, first.more, second.done, second.more) == (3, True, 2, False)
    assert set(statuses(conn, *mine)) == {"cancelled"}
    assert statuses(conn, other_task, other_queue) == ["queued", "queued"]


def test_a_status_filter_the_action_does_not_apply_to_changes_nothing(
    conn: sa.Connection,
) -> None:
    dead = add_dead(conn, queue="bk-n")
    assert cancel_jobs(conn, queue="bk-n", statuses=["dead"]) == BulkBatch(0, 0, 0, False)
    assert run_jobs_now(conn, ids=[dead]) == BulkBatch(0, 0, 1, False)
    assert statuses(conn, dead) == ["dead"]


def test_retry_by_ids_and_by_filter_respects_unique_keys(conn: sa.Connection) -> None:
    dead = add_dead(conn, queue="bk-r", task="t.u", unique_key="k1")
    held = add_dead(conn, queue="bk-r", task="t.u", unique_key="k2")
    add_job(conn, queue="bk-r", task="t.u", unique_key="k2")  # a live job holds k2
    cancelled = add_job(conn, queue="bk-r", task="t.u", status="cancelled")

    assert retry_jobs(conn, ids=[dead, held, cancelled]) == BulkBatch(1, 0, 2, False)
    assert statuses(conn, dead, held, cancelled) == ["queued", "dead", "cancelled"]

    other = add_dead(conn, queue="bk-r", task="t.v")
    batch = retry_jobs(conn, queue="bk-r", attempts="reset")
    assert (batch.done, batch.left) == (1, 1)
    assert statuses(conn, other, held) == ["queued", "dead"]


def test_delete_never_removes_a_live_job(conn: sa.Connection) -> None:
    live = [
        add_job(conn, queue="bk-d"),
        add_job(conn, queue="bk-d", status="running", attempts=1, started_ago=1),
        add_job(conn, queue="bk-d", status="waiting"),
    ]
    finished = [
        add_job(conn, queue="bk-d", status="succeeded", attempts=1),
        add_job(conn, queue="bk-d", status="cancelled"),
        add_dead(conn, queue="bk-d"),
    ]

    by_ids = delete_jobs(conn, ids=[*live, finished[0]])
    by_filter = delete_jobs(conn, queue="bk-d")

    assert by_ids == BulkBatch(1, 0, 3, False)
    assert (by_filter.done, by_filter.left) == (2, 0)
    assert statuses(conn, *live) == ["queued", "running", "waiting"]
    assert statuses(conn, *finished) == [None, None, None]
    # Asked for live statuses alone, a delete by filter picks nothing.
    assert delete_jobs(conn, queue="bk-d", statuses=["queued", "running"]).done == 0


def test_delete_shares_one_batch_between_the_two_indexes(conn: sa.Connection) -> None:
    for _ in range(3):
        add_job(conn, queue="bk-b", status="succeeded", attempts=1)
        add_dead(conn, queue="bk-b")
    assert count_matching(conn, "delete", queue="bk-b") == 6
    assert count_matching(conn, "delete", queue="bk-b", upto=4) == 5  # "over 4"

    first = delete_jobs(conn, queue="bk-b", batch=4)
    second = delete_jobs(conn, queue="bk-b", batch=4)

    assert (first.done, first.more, second.done, second.more) == (4, True, 2, False)


def test_run_now_moves_only_queued_jobs_due_later(conn: sa.Connection) -> None:
    later = add_job(conn, queue="bk-n2", visible_in=3600)
    due = add_job(conn, queue="bk-n2", visible_in=-5)
    running = add_job(
        conn, queue="bk-n2", status="running", attempts=1, started_ago=1, visible_in=30
    )
    lease = conn.execute(sa.select(j.visible_at).where(j.id == running)).scalar_one()
    assert count_matching(conn, "run_now", queue="bk-n2") == 1

    assert run_jobs_now(conn, queue="bk-n2") == BulkBatch(1, 0, 0, False, last_id=later)
    assert run_jobs_now(conn, ids=[later, due, running]) == BulkBatch(0, 0, 3, False)

    due_now = sa.select(j.visible_at <= sa.func.now()).where(j.id == later)
    assert conn.execute(due_now).scalar_one() is True
    assert conn.execute(sa.select(j.visible_at).where(j.id == running)).scalar_one() == lease


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ([], "give 1 to"),
        (list(range(1, MAX_IDS + 2)), "give 1 to"),
        ([0], "positive int"),
        (["1"], "positive int"),
        ("12", "collection"),
    ],
)
def test_bad_ids_are_refused_before_any_sql(conn: sa.Connection, ids: object, message: str) -> None:
    with pytest.raises(InvalidJobError, match=message):
        cancel_jobs(conn, ids=ids)  # type: ignore[arg-type]
    assert conn.execute(sa.select(1)).scalar_one() == 1  # the transaction is still usable


def test_older_than_and_unknown_status(conn: sa.Connection) -> None:
    old = add_job(conn, queue="bk-o", created_ago=7200)
    new = add_job(conn, queue="bk-o")
    assert cancel_jobs(conn, queue="bk-o", older_than=timedelta(hours=1)).done == 1
    assert statuses(conn, old, new) == ["cancelled", "queued"]
    with pytest.raises(InvalidJobError, match="unknown status"):
        cancel_jobs(conn, queue="bk-o", statuses=["lost"])
