"""sa_jobqueue: a durable, multi-worker job queue in the PostgreSQL database you already have.

The promise:

* Exactly-once enqueue. ``JobQueue.enqueue`` runs in your Session's transaction and never
  commits: the job exists if and only if your transaction commits.
* At-least-once execution. A job runs again if its worker dies, stalls past its lease, or loses
  its connection while completing. Make side effects outside the database idempotent.
* Fencing. Every transition of a running job is checked against the attempt that claimed it,
  so a stale attempt can never overwrite a newer one.
* Exactly-once database effects. Writes a handler makes through ``ctx.session`` commit in the
  same transaction as the job's fenced completion, or not at all.
"""

from importlib.metadata import PackageNotFoundError, version

from .errors import (
    AppImportError,
    DatabaseUnavailableError,
    InvalidJobError,
    InvalidNameError,
    InvalidScheduleError,
    JobQueueError,
    PayloadError,
    SchemaError,
    SchemaManagedElsewhereError,
    SchemaMissingError,
    SchemaOutdatedError,
    TaskDefinitionError,
    UnknownTaskError,
)
from .queue import Enqueued, JobInfo, JobQueue
from .tasks import Backoff, Discard, JobContext, Retry, Task
from .worker import Worker

try:
    #: This release's version, from the installed distribution (pyproject.toml's, one source).
    __version__ = version("sa_jobqueue")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
del PackageNotFoundError, version

__all__ = [
    "AppImportError",
    "Backoff",
    "DatabaseUnavailableError",
    "Discard",
    "Enqueued",
    "InvalidJobError",
    "InvalidNameError",
    "InvalidScheduleError",
    "JobContext",
    "JobInfo",
    "JobQueue",
    "JobQueueError",
    "PayloadError",
    "Retry",
    "SchemaError",
    "SchemaManagedElsewhereError",
    "SchemaMissingError",
    "SchemaOutdatedError",
    "Task",
    "TaskDefinitionError",
    "UnknownTaskError",
    "Worker",
    "__version__",
]
