"""``requeue_dead_jobs``: retrying the dead jobs of a filter in bounded batches, on PostgreSQL.

The one operation behind ``sa-jobqueue jobs retry --queue ...`` and the dashboard's "Retry all
matching", called here as both call it, in a transaction rolled back after each test. Each test's
jobs sit in queues of its own, since the tier's database is shared.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from sa_jobqueue.errors import InvalidJobError
from sa_jobqueue.ops import RequeuedBatch, requeue_dead_jobs
from sa_jobqueue.ops.requeue import REQUEUE_BATCH
from tests.helpers.job_states import add_dead, add_job
from tests.helpers.jobs import row


def _all_batches(conn: sa.Connection, batch: int, **filters: Any) -> list[RequeuedBatch]:
    """Every batch, as the CLI runs them: each going on from the last one's highest id."""
    done = [requeue_dead_jobs(conn, batch=batch, **filters)]
    while done[-1].more:
        assert len(done) < 10, f"no end in sight: {done[-3:]}"  # a walk that does not advance
        done.append(requeue_dead_jobs(conn, batch=batch, after_id=done[-1].last_id, **filters))
    return done


def test_batches_requeue_every_match_once_and_nothing_else(conn: sa.Connection) -> None:
    mine = [add_dead(conn, queue="rq-a", task="t.a", created_ago=7200) for _ in range(5)]
    recent = add_dead(conn, queue="rq-a", task="t.a")
    other_task = add_dead(conn, queue="rq-a", task="t.b", created_ago=7200)
    other_queue = add_dead(conn, queue="rq-b", task="t.a", created_ago=7200)
    queued = add_job(conn, queue="rq-a", task="t.a", created_ago=7200)

    batches = _all_batches(
        conn, 2, queue="rq-a", task="t.a", older_than=timedelta(hours=1), attempts="reset"
    )

    assert [(b.requeued, b.kept, b.more) for b in batches] == [
        (2, 0, True),
        (2, 0, True),
        (1, 0, False),
    ]
    assert [b.last_id for b in batches] == [mine[1], mine[3], mine[4]]
    assert {row(conn, i).status for i in mine} == {"queued"}
    assert {row(conn, i).attempts for i in mine} == {0}
    for untouched in (recent, other_task, other_queue):
        assert row(conn, untouched).status == "dead"
    assert row(conn, queued).status == "queued"
    # Nothing left: one more call picks nothing.
    assert requeue_dead_jobs(conn, queue="rq-a", task="t.a", older_than=timedelta(hours=1)) == (
        RequeuedBatch(requeued=0, kept=0, last_id=None, more=False)
    )


def test_a_batch_left_dead_by_unique_keys_does_not_stop_the_walk(conn: sa.Connection) -> None:
    """A full batch of jobs whose keys live jobs hold: the next batch starts past them."""
    held = [add_dead(conn, queue="rq-held", unique_key=f"k{i}") for i in range(2)]
    for i in range(2):
        add_job(conn, queue="rq-held", unique_key=f"k{i}")
    free = add_dead(conn, queue="rq-held", unique_key="free")

    batches = _all_batches(conn, 2, queue="rq-held")

    assert [(b.requeued, b.kept, b.last_id) for b in batches] == [(0, 2, held[1]), (1, 0, free)]
    assert [row(conn, i).status for i in held] == ["dead", "dead"]
    assert row(conn, free).status == "queued"


def test_of_two_dead_jobs_with_one_unique_key_the_lower_id_is_requeued(
    conn: sa.Connection,
) -> None:
    """Each died holding the key in turn, so neither sees a live holder: requeued together,
    the second broke the unique index and aborted the caller's transaction (model checker
    seed 940113). The lower id is requeued, the other stays dead; a later batch finds it held."""
    first, second = (add_dead(conn, queue="rq-twins", unique_key="twin") for _ in range(2))
    other = add_dead(conn, queue="rq-twins", unique_key="single")

    done = requeue_dead_jobs(conn, queue="rq-twins")

    assert (done.requeued, done.kept) == (2, 1)
    assert [row(conn, i).status for i in (first, second, other)] == ["queued", "dead", "queued"]
    again = requeue_dead_jobs(conn, queue="rq-twins")
    assert (again.requeued, again.kept) == (0, 1)
    assert row(conn, second).status == "dead"


def test_extend_raises_max_attempts_as_requeue_job_does(conn: sa.Connection) -> None:
    job_id = add_dead(conn, queue="rq-extend", attempts=3, max_attempts=3)
    done = requeue_dead_jobs(conn, queue="rq-extend")
    assert (done.requeued, done.more) == (1, False)
    requeued = row(conn, job_id)
    assert (requeued.status, requeued.attempts, requeued.max_attempts) == ("queued", 3, 6)
    assert (requeued.finished_at, requeued.worker) == (None, None)


def test_the_batch_size_is_one_statement_of_bounded_cost() -> None:
    assert REQUEUE_BATCH == 5_000


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"attempts": "never"}, "attempts must be 'extend' or 'reset'"),
        ({"batch": 0}, "batch must be an int from 1 to 10000"),
        ({"queue": ""}, "a queue name is 1 to 64 characters"),
        ({"task": "t\x00"}, "a task name is 1 to 200 characters"),
        ({"older_than": timedelta(seconds=-1)}, "older_than must be a timedelta of 0s or more"),
        # Past what now() minus it can be: the server's refusal would abort the transaction.
        ({"older_than": timedelta(days=10**8)}, "older_than must be a timedelta of at most"),
        ({"after_id": "12"}, "after_id must be a job id"),
        ({"after_id": 2**63}, "after_id must be a job id"),
    ],
)
def test_bad_arguments_are_refused_before_any_sql(
    conn: sa.Connection, arguments: dict[str, Any], message: str
) -> None:
    job_id = add_dead(conn, queue="rq-bad")
    with pytest.raises(InvalidJobError, match=message):
        requeue_dead_jobs(conn, **arguments)
    # The transaction is still usable, and nothing changed.
    assert row(conn, job_id).status == "dead"
