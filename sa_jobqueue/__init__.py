"""sa_jobqueue: a durable, multi-worker job queue in the PostgreSQL database you already have.

The promise:

* Exactly-once enqueue. ``JobQueue.enqueue`` runs in your Session's transaction and never
  commits: the job exists if and only if your transaction commits.
* At-least-once execution. A job runs again if its worker dies, stalls past its lease, or loses
  its connection while completing. Make side effects outside the database idempotent.
* Fencing. Every transition of a running job is checked against the attempt that claimed it,
  so a stale attempt can never overwrite a newer one.
* Exactly-once database effects. Writes a handler makes through ``ctx.session`` commit in the
  same transaction as the job's fenced completion, or not at all; a batch task's, with the
  fenced completions of all its batch's jobs that succeed, or not at all.

What this module exports is what an application needs to declare, enqueue and run jobs. The
rest has a home of its own: every exception in :mod:`sa_jobqueue.errors` (the root and the two
families callers catch most are here too), operator calls in :mod:`sa_jobqueue.ops`, engines
in :mod:`sa_jobqueue.database`, the schema in :mod:`sa_jobqueue.migrations`, helpers for your
tests in :mod:`sa_jobqueue.testing`, observers in :mod:`sa_jobqueue.observability`.
"""

from importlib.metadata import PackageNotFoundError, version

from ._backoff import Backoff
from ._enqueue import Enqueued
from .batching import BatchContext, BatchJob
from .errors import InvalidJobError, JobQueueError, SchemaError
from .observability import Observer
from .ops.admin import JobInfo
from .queue import JobQueue
from .results import JobResult
from .tasks import Discard, JobContext, Retry, Task
from .worker import Worker

try:
    #: This release's version, from the installed distribution (pyproject.toml's, one source).
    __version__ = version("sa_jobqueue")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
del PackageNotFoundError, version

__all__ = [
    "Backoff",
    "BatchContext",
    "BatchJob",
    "Discard",
    "Enqueued",
    "InvalidJobError",
    "JobContext",
    "JobInfo",
    "JobQueue",
    "JobQueueError",
    "JobResult",
    "Observer",
    "Retry",
    "SchemaError",
    "Task",
    "Worker",
    "__version__",
]
