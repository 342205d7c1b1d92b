"""A waiting job holds its unique key from its enqueue, as a queued or running one does; and
no job's release can fail the statement that releases it: a waiting job whose key another
live job holds (a database where such a pair was made before revision sajq_0013) is
cancelled as a unique conflict when its dependencies end, and the completion or the claim
that ended them goes on for every other job it carries."""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from sa_jobqueue._sql import claiming
from sa_jobqueue.models import jobs_table
from sa_jobqueue.workflows import Dependency
from tests.apps.unique_waiting import queue
from tests.helpers.processes import WorkerApp, Workers

WORKER_APP = WorkerApp("tests.apps.unique_waiting:queue", log_level="WARNING")
j = jobs_table.c
KEY = "acct9"

#: The unique index as it was before revision sajq_0013 (queued and running jobs only): a
#: database where a waiting job and a queued one of the same key could both be live.
OLD_INDEX = (
    "DROP INDEX sa_jobqueue_jobs_unique_idx;"
    " CREATE UNIQUE INDEX sa_jobqueue_jobs_unique_idx ON sa_jobqueue_jobs (task, unique_key)"
    " WHERE unique_key IS NOT NULL AND status IN ('queued', 'running')"
)


def rows(engine: sa.Engine, *ids: int) -> dict[int, sa.Row[tuple[str, object]]]:
    with engine.connect() as conn:
        found = conn.execute(sa.select(j.id, j.status, j.last_error).where(j.id.in_(ids)))
        return {row.id: row for row in found}


def enqueue_again(engine: sa.Engine, index: str) -> int:
    """The same task and key, due in an hour, in a transaction of its own.

    With the ``old`` index, as a database from before sajq_0013 could hold it: the index is
    put back as it was, and the job's key is set by hand (enqueue's ON CONFLICT names the
    current index's predicate, which the old index does not serve).
    """
    if index == "current":
        with Session(engine) as session, session.begin():
            again = queue.enqueue(session, "quick", {}, unique_key=KEY, run_at=timedelta(hours=1))
        return int(again)
    with engine.begin() as conn:
        conn.exec_driver_sql(OLD_INDEX)
    with Session(engine) as session, session.begin():
        again = queue.enqueue(session, "quick", {}, run_at=timedelta(hours=1))
        session.execute(sa.update(jobs_table).where(j.id == again).values(unique_key=KEY))
    return int(again)


def test_a_waiting_job_holds_its_unique_key(engine: sa.Engine) -> None:
    with Session(engine) as session, session.begin():
        dep = queue.enqueue(session, "quick", {})
        waiting = queue.enqueue(session, "quick", {}, unique_key=KEY, depends_on=[dep])
    with Session(engine) as session, session.begin():
        again = queue.enqueue(session, "quick", {}, unique_key=KEY, run_at=timedelta(hours=1))
        many = queue.enqueue_many(session, "quick", [{}], unique_keys=[KEY])
        replaced = queue.enqueue(session, "quick", {"n": 2}, unique_key=KEY, unique_mode="replace")
    assert again == waiting
    assert not again.created
    assert many == [waiting]
    assert not many[0].created
    assert replaced == waiting
    assert not replaced.created
    with engine.connect() as conn:
        count = conn.execute(sa.select(sa.func.count()).where(j.unique_key == KEY)).scalar_one()
    assert count == 1


@pytest.mark.parametrize("index", ["current", "old"])
def test_a_release_never_fails_the_completions_batched_with_it(
    engine: sa.Engine, workers: Workers, index: str
) -> None:
    """D and seven others complete in one batch; W waits for D and has a unique key that a
    second enqueue names too."""
    with Session(engine) as session, session.begin():
        dep = queue.enqueue(session, "quick", {})
        others = queue.enqueue_many(session, "quick", [{}] * 7)
        waiting = queue.enqueue(session, "quick", {}, unique_key=KEY, depends_on=[dep])
    again = enqueue_again(engine, index)
    workers.start(concurrency=16)
    batch = [dep, *others]
    workers.wait(
        lambda: all(r.status == "succeeded" for r in rows(engine, *batch).values()), timeout=30
    )
    if index == "current":
        assert again == waiting
        workers.wait(lambda: rows(engine, waiting)[waiting].status == "succeeded", timeout=30)
    else:
        # The old index let the second job in beside the waiting one: the waiting one is the
        # duplicate, cancelled when released; the job that held the key is left as it was.
        assert again != waiting
        found = rows(engine, waiting, again)
        assert found[waiting].status == "cancelled"
        assert found[waiting].last_error["type"] == "UniqueConflict"
        assert str(again) in found[waiting].last_error["message"]
        assert found[again].status == "queued"


@pytest.mark.parametrize("index", ["current", "old"])
def test_a_release_by_the_claim_never_stops_the_queue(
    engine: sa.Engine, workers: Workers, index: str
) -> None:
    """D's worker is lost with D's last attempt: the next claim ends D dead and releases W
    (on_failure="run"), in the claim statement; jobs queued beside them must still start."""
    with Session(engine) as session, session.begin():
        dep = queue.enqueue(session, "quick", {}, max_attempts=1, lease=timedelta(seconds=1))
    with engine.begin() as conn:  # D's one attempt, whose worker is never heard of again
        params = {"from_queue": "uniq", "limit": 1, "worker": "lost"}
        assert [r.id for r in conn.execute(claiming.claim(), params)] == [dep]
    with Session(engine) as session, session.begin():
        edge = Dependency(dep, on_failure="run")
        waiting = queue.enqueue(session, "quick", {}, unique_key=KEY, depends_on=[edge])
    again = enqueue_again(engine, index)
    with Session(engine) as session, session.begin():
        others = queue.enqueue_many(session, "quick", [{}] * 5)
    with engine.connect() as conn:  # D's lease has run out by the database's clock
        workers.wait(
            lambda: conn.execute(
                sa.select(j.visible_at < sa.func.clock_timestamp()).where(j.id == dep)
            ).scalar_one(),
            timeout=10,
        )
    workers.start(concurrency=4)
    workers.wait(
        lambda: all(r.status == "succeeded" for r in rows(engine, *others).values()), timeout=30
    )
    found = rows(engine, dep, waiting, again)
    assert found[dep].status == "dead"
    if index == "current":
        assert again == waiting
        workers.wait(lambda: rows(engine, waiting)[waiting].status == "succeeded", timeout=30)
    else:
        assert found[waiting].status == "cancelled"
        assert found[waiting].last_error["type"] == "UniqueConflict"
        assert found[again].status == "queued"
