"""The steps of a workflow that tests/acceptance/test_workflow_objects.py cancels and retries
while worker subprocesses (``tests.apps.workflow_steps:queue``) run it and are killed.

Each step works for ``payload["ms"]`` milliseconds, looking at ``ctx.stop_requested`` (a
cancel, a lost lease) every 20 ms and returning early when it turns True, then writes its
effect through ``ctx.session``: one row of ``workflow_effects``, with the database clock. The
table has no unique key on ``job_id``: only the fenced completion keeps a second effect of a
step out, so counting the rows per job checks that each step's effect happened once.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from sa_jobqueue import JobContext, JobQueue

metadata = sa.MetaData()
effects = sa.Table(
    "workflow_effects",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("job_id", sa.BigInteger, nullable=False, index=True),
    sa.Column("step", sa.Text, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("at", sa.DateTime(timezone=True), nullable=False),
)

queue = JobQueue(default_queue="steps")


# A short lease: a killed worker's jobs are claimed again (or, cancellation requested, ended
# cancelled) within 2 s.
@queue.task(lease=timedelta(seconds=2))
def step(ctx: JobContext, payload: Any) -> None:
    deadline = time.monotonic() + payload.get("ms", 0) / 1000
    while time.monotonic() < deadline:
        if ctx.stop_requested:
            return  # cancelled or lease lost: nothing it writes can complete the job
        time.sleep(0.02)
    ctx.session.execute(
        effects.insert().values(
            job_id=ctx.job_id,
            step=payload["step"],
            attempt=ctx.attempt,
            pid=os.getpid(),
            at=sa.func.clock_timestamp(),
        )
    )
