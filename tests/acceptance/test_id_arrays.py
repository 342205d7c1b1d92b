"""Job ids bound as arrays are bigints, whatever ints they are: ``Enqueued`` values (an int
subclass, which psycopg would type by the first element's size) on each side of 32767/32768
and of 2^31, where a smallint or integer array would overflow."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from sa_jobqueue import JobContext, JobQueue
from sa_jobqueue.models import jobs_table

j = jobs_table.c

#: Sequence values just below a boundary of PostgreSQL's integer types: the next two ids drawn
#: are the last one that fits the smaller type and the first one that does not.
BOUNDARIES = [pytest.param(2**15 - 2, id="smallint"), pytest.param(2**31 - 2, id="integer")]


def make_queue() -> JobQueue:
    queue = JobQueue(default_queue="ids")

    @queue.task(keep_result=True)
    def step(ctx: JobContext, payload: Any) -> Any:
        return payload

    return queue


def set_next_id(engine: sa.Engine, last: int) -> None:
    with engine.begin() as conn:
        sequence = sa.func.pg_get_serial_sequence(jobs_table.name, j.id.name)
        conn.execute(sa.select(sa.func.setval(sequence, last)))


@pytest.mark.parametrize("last", BOUNDARIES)
def test_waiting_for_results_of_ids_across_a_type_boundary(engine: sa.Engine, last: int) -> None:
    queue = make_queue()
    set_next_id(engine, last)
    with Session(engine) as session, session.begin():
        low, high = queue.enqueue_many(session, "step", [{"n": 1}, {"n": 2}])
        for job_id in (low, high):
            queue.cancel(session, job_id)
    assert (low, high) == (last + 1, last + 2)
    outcomes = queue.wait_for_result(engine, [low, high], timeout=10)
    assert [o.status for o in outcomes] == ["cancelled", "cancelled"]
    with Session(engine) as session:
        found = queue.get_result(session, high)
    assert found is not None
    assert found.status == "cancelled"
