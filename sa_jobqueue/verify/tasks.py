"""The task ``sa-jobqueue verify`` runs in real worker processes; not for use on its own.

verify starts the unchanged worker command, ``python -m sa_jobqueue worker
sa_jobqueue.verify.tasks:queue``, with ``SA_JOBQUEUE_VERIFY_SCHEMA`` naming the run's schema
and ``DATABASE_URL`` the database, with ``-c search_path=<schema>`` in its ``options``: every
engine of the process keeps those (as startup options, or applied in every transaction behind
a transaction pooler), so the claim loop, the heartbeat, the handlers' sessions and the schema
check all work inside the schema. Without both the import fails: these jobs must never run
against your own tables.

A worker whose verify process is gone (killed with SIGKILL, so it could not clean up) sends
itself SIGTERM within a second or so, and exits after its running jobs.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

from sqlalchemy.engine import make_url

from .._sql import verify as verify_sql
from ..database import POOLER_ENV, as_pooler, create_engine, url_options
from ..queue import JobQueue
from ..tasks import JobContext
from .names import PARENT_ENV, QUEUE, SCHEMA_ENV, TASK, schema_options

_schema = os.environ.get(SCHEMA_ENV, "")
_database_url = os.environ.get("DATABASE_URL", "")
if not _schema or not _database_url:
    raise RuntimeError(
        f"{__name__} is run by the workers `sa-jobqueue verify` starts"
        f" ({SCHEMA_ENV} and DATABASE_URL must be set)"
    )
_pooler = as_pooler(os.environ.get(POOLER_ENV))
# verify puts the schema in the URL's options, which every engine of the process honours (as
# startup options, or per transaction behind a transaction pooler): make sure it did.
if schema_options(_schema) not in (url_options(make_url(_database_url)) or ""):
    raise RuntimeError(f"{__name__}: DATABASE_URL does not point into schema {_schema}")


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1)
    os.kill(os.getpid(), signal.SIGTERM)  # the worker's graceful shutdown


if os.environ.get(PARENT_ENV, "").isdigit():
    threading.Thread(
        target=_watch_parent,
        args=(int(os.environ[PARENT_ENV]),),
        name="sa_jobqueue-verify-parent",
        daemon=True,
    ).start()

#: The executions record: autocommit, outside the job's transaction, so it survives a rollback
#: and a SIGKILL. Connections are opened as handler threads need them.
_recorder = create_engine(
    _database_url,
    pooler=_pooler,
    isolation_level="AUTOCOMMIT",
    pool_size=16,
    max_overflow=-1,
    pool_pre_ping=False,
)

queue = JobQueue(default_queue=QUEUE)


@queue.task(name=TASK)
def verify_job(ctx: JobContext, payload: Any) -> None:
    """Record the execution, "work" ``payload["ms"]`` milliseconds, write the result once."""
    pid = os.getpid()
    with _recorder.connect() as conn:
        started = conn.execute(
            verify_sql.record_run(), {"job_id": ctx.job_id, "attempt": ctx.attempt, "pid": pid}
        ).scalar_one()
    if payload.get("ms"):
        time.sleep(payload["ms"] / 1000)
    # Through ctx.session: committed together with the job's completion, or not at all.
    ctx.session.execute(
        verify_sql.record_result(),
        {"job_id": ctx.job_id, "attempt": ctx.attempt, "pid": pid, "started_at": started},
    )
