"""A workflow's node, run by worker subprocesses (``tests.apps.dag:queue``): each run records
when it started (the database clock) through ``ctx.session``, so the record commits with the
job's completion, once, or not at all."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from sa_jobqueue import JobContext, JobQueue

metadata = sa.MetaData()
runs = sa.Table(
    "dag_runs",
    metadata,
    sa.Column("job_id", sa.BigInteger, primary_key=True),
    sa.Column("node", sa.Text, nullable=False),
    sa.Column("started", sa.DateTime(timezone=True), nullable=False),
)

queue = JobQueue(default_queue="dag")


@queue.task(lease=timedelta(seconds=3))
def node(ctx: JobContext, payload: Any) -> None:
    started = ctx.session.execute(sa.select(sa.func.clock_timestamp())).scalar_one()
    time.sleep(payload.get("ms", 0) / 1000)
    ctx.session.execute(
        runs.insert().values(job_id=ctx.job_id, node=payload["node"], started=started)
    )
