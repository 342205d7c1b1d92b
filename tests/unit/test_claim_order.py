"""The claim order is defined once (``models.CLAIM_ORDER``): the claim index, every claim's
ORDER BY and the worker's claim position follow it.

The migration that created the index is history and stays as written; the migrations test
(``test_migrated_database_matches_the_models``) compares it with the model's index, columns
included, so a change of the order without a new migration fails there.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial

import pytest
from sqlalchemy import Index
from sqlalchemy.dialects.postgresql import psycopg
from sqlalchemy.sql import ClauseElement

from sa_jobqueue._sql import claim_limits, claiming
from sa_jobqueue.models import CLAIM_ORDER, jobs_table
from sa_jobqueue.worker._claimed import Claimed

STATEMENTS: dict[str, Callable[[], ClauseElement]] = {
    "claim": claiming.claim,
    "claim_after": claiming.claim_after,
    "limited": partial(claim_limits.claim_limited, keyed=False),
    "limited_keyed": partial(claim_limits.claim_limited, keyed=True),
    "limited_completing": partial(claim_limits.claim_limited, keyed=False, completing=True),
    "limited_keyed_completing": partial(claim_limits.claim_limited, keyed=True, completing=True),
}


def test_the_claim_index_is_the_queue_then_the_claim_order() -> None:
    (index,) = [i for i in jobs_table.indexes if i.name == "sa_jobqueue_jobs_claim_idx"]
    assert isinstance(index, Index)
    assert tuple(column.name for column in index.columns) == ("queue", *CLAIM_ORDER)


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_every_order_by_of_a_claim_is_the_claim_order(name: str) -> None:
    sql = str(STATEMENTS[name]().compile(dialect=psycopg.dialect()))
    # Each ORDER BY lists the claim order's columns of one relation: the jobs table, or the
    # keyed claim's head (whose window function ranks in the same order).
    orders = re.findall(r"ORDER BY ((?:\w+\.\w+(?:, )?)+)", sql)
    assert orders, sql
    for order in orders:
        relations = {column.split(".")[0] for column in order.split(", ")}
        assert len(relations) == 1, order
        (relation,) = relations
        assert order == ", ".join(f"{relation}.{name}" for name in CLAIM_ORDER)


def test_the_worker_claims_past_a_job_in_claim_order() -> None:
    due = datetime(2026, 1, 1, tzinfo=UTC)
    job = Claimed(7, "q", "t", "null", "running", 1, 5, timedelta(30), None, None, 3, due)
    assert job.position() == (3, due, 7)
    params = claiming.position_params(job.position())
    assert params == {"after_priority": 3, "after_visible_at": due, "after_id": 7}
    compiled = claiming.claim_after().compile(dialect=psycopg.dialect())
    assert set(params) <= {key for key, bind in compiled.binds.items() if bind.required}
