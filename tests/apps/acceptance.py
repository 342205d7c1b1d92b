"""The tasks the acceptance tests run in real worker subprocesses.

Every handler first records the run in ``acceptance_runs`` through its own autocommit
connection, so that table counts every execution, including attempts whose transaction was
rolled back or whose worker was killed. Writes that must happen exactly once go to
``acceptance_effects`` through ``ctx.session`` and commit with the job's completion.

The tables and the writes are built with :mod:`tests.apps.common`; the tests create both
tables with :data:`metadata` in their own database.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from sa_jobqueue import JobContext, JobQueue
from tests.apps import common

metadata = sa.MetaData()

#: One effect per job at most, enforced by the primary key on ``job_id``.
effects = common.effects_table("acceptance_effects", metadata, one_per_job=True)

runs = common.runs_table(
    "acceptance_runs",
    metadata,
    sa.Column("at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    index_job_id=False,
)

queue = JobQueue()

#: Not a JobQueue: the CLI must refuse it.
not_a_queue = {"this": "is a dict"}

#: Longest a handler waits for something the test controls before giving up (seconds).
HANDLER_WAIT = 60.0

# Two connections per worker process at most: the handlers only insert one row.
recorder = common.Recorder(runs, effects, pool_size=2, max_overflow=0, pool_pre_ping=False)
#: Count this execution outside the job's transaction (it survives rollbacks and kills).
record_run = recorder.record_run
#: The exactly-once effect: committed together with the job's completion, or not at all.
write_effect = recorder.write_effect


@queue.task
def effect(ctx: JobContext, payload: Any) -> None:
    record_run(ctx)
    write_effect(ctx)


@queue.task(lease=timedelta(seconds=2))
def stall_first(ctx: JobContext, payload: Any) -> None:
    """Hang on the first attempt (the test SIGKILLs the worker meanwhile); succeed afterwards."""
    record_run(ctx)
    if ctx.attempt == 1:
        time.sleep(HANDLER_WAIT)
        raise RuntimeError("the test was supposed to kill this worker")
    write_effect(ctx)


@queue.task(max_attempts=3, lease=timedelta(seconds=1))
def poison(ctx: JobContext, payload: Any) -> None:
    """Kill the worker process running it, on every attempt."""
    record_run(ctx)
    os.kill(os.getpid(), signal.SIGKILL)


@queue.task
def gated(ctx: JobContext, payload: Any) -> None:
    """Work that lasts until the test creates the file ``payload["gate"]``, then a little more."""
    record_run(ctx)
    common.wait_for_file(Path(payload["gate"]), HANDLER_WAIT)
    time.sleep(0.5)  # the rest of the work
    write_effect(ctx)
