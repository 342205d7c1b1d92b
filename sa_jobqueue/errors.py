"""The exceptions sa_jobqueue raises.

Every exception derives from :class:`JobQueueError`; catching it catches all of ours, and
nothing else. A database driver's error, when it is the cause, stays in ``__cause__``::

    JobQueueError
     ├── InvalidJobError (ValueError)        bad input to enqueue or a job operation; nothing sent
     │    ├── PayloadError                     the payload is not plain JSON, or is too large
     │    │    ├── PayloadTypeError             it does not fit the type the task's handler takes
     │    │    └── UnstorableResultError        a result a task keeps is not JSON, or too large
     │    ├── InvalidNameError                 a queue or task name breaks the naming rules
     │    ├── InvalidScheduleError             run_at is naive, or an option is out of range
     │    └── InvalidWorkflowError             a DAG with a cycle, an unknown or a repeated step
     ├── InvalidLimitError (ValueError)      a queue's concurrency cap or rate is not valid
     ├── InvalidProgressError (ValueError)   a handler reported a progress that is not valid
     ├── UnknownTaskError (LookupError)      no task of that name is registered
     ├── UnknownJobError (LookupError)       no job has that id (a wait for a result)
     ├── UnknownWorkflowError (LookupError)  no job carries that workflow id
     ├── WorkflowNotFinishedError            a delete of a workflow whose jobs have not all ended
     ├── ResultTimeoutError (TimeoutError)   a wait for a result ran out of time
     ├── JobFailedError                      a result asked of a job that did not succeed
     ├── HardTimeoutError (TimeoutError)     an attempt was killed at its task's hard_timeout
     ├── AttemptStoppedError                 the worker stopped an async or batch handler
     ├── SwallowedError                      a handler went on past a failed statement
     ├── TaskDefinitionError (ValueError)    a task is declared twice, or with bad options
     ├── SchemaError                         the database lacks the schema this version needs
     │    ├── SchemaMissingError
     │    ├── SchemaOutdatedError
     │    ├── SchemaManagedElsewhereError    another route of installing it owns the schema
     │    └── MigrationLockTimeoutError      an upgrade gave up waiting for a lock: run it again
     ├── WorkerConfigError (ValueError)      a Worker option is out of range
     ├── WebConfigError (ValueError)         a dashboard option (a host, an origin) is malformed
     ├── DatabaseUnavailableError            the database cannot be reached (wrong DSN, server down)
     └── AppImportError                      the worker's ``module:attribute`` could not be loaded

Inside a transaction that belongs to the caller (``enqueue`` on the caller's Session), a database
error is not wrapped: it propagates unchanged, as SQLAlchemy raised it.
"""

from __future__ import annotations


class JobQueueError(Exception):
    """Something went wrong in sa_jobqueue."""

    def __init__(self, message: str | None = None) -> None:
        # The class docstring's first line is the default message, so a bare ``raise X()``
        # still says something useful.
        doc = (type(self).__doc__ or "").strip().splitlines()
        super().__init__(message or (doc[0] if doc else type(self).__name__))


class InvalidJobError(JobQueueError, ValueError):
    """The job was rejected before anything was sent to the database."""


class PayloadError(InvalidJobError):
    """The payload is not plain JSON (dict, list, str, int, float, bool, None) or is too large."""


class PayloadTypeError(PayloadError):
    """The payload does not fit the type the task's handler declares for it.

    Raised by ``enqueue`` before any SQL (the caller's transaction stays usable). In a worker,
    a stored payload that no longer fits (the type changed in a deploy since the job was
    enqueued) fails the attempt with it, recorded as the job's ``last_error``, and the job is
    retried under its task's policy like any failure.
    """


class UnstorableResultError(PayloadError):
    """What a task that keeps its result returned cannot be stored (not JSON, or too large).

    Never raised to a caller: the attempt's error (``last_error``). Deterministic, so the job
    goes to dead at once: another attempt would run the handler (and its effects outside
    ``ctx.session``) again, only to be refused the same way.
    """


class InvalidNameError(InvalidJobError):
    """A queue or task name breaks the naming rules."""


class InvalidScheduleError(InvalidJobError):
    """A scheduling option (run_at, priority, max_attempts, lease) is not valid."""


class InvalidWorkflowError(InvalidJobError):
    """The workflow was rejected before anything was sent: a step named twice, a step that
    needs an unknown step, a cycle, or too many jobs."""


class InvalidLimitError(JobQueueError, ValueError):
    """A queue limit (a concurrency cap, or a rate such as ``50/s``) is not valid."""


class InvalidProgressError(JobQueueError, ValueError):
    """A handler reported a progress that is not valid (a fraction outside 0 to 1, or a message
    that is too long or cannot be stored).

    Raised by ``ctx.report_progress`` in the handler, at the call: a programming error, which
    fails the attempt like any exception the handler lets out. A valid report is only kept in
    memory by the call; writing it (see the progress how-to) never raises into the handler.
    """


class UnknownTaskError(JobQueueError, LookupError):
    """No task of that name is registered with this JobQueue."""


class UnknownJobError(JobQueueError, LookupError):
    """No job has that id: never enqueued, not committed yet, or pruned after its retention."""

    def __init__(self, job_ids: list[int]) -> None:
        shown = ", ".join(map(str, job_ids[:10])) + (", ..." if len(job_ids) > 10 else "")
        super().__init__(f"no job with id {shown} (never enqueued, not committed, or pruned)")
        self.job_ids = job_ids


class UnknownWorkflowError(JobQueueError, LookupError):
    """No job carries that workflow id: never created, not committed, or all its jobs deleted
    (pruned after their retention, or by a delete of the workflow)."""

    def __init__(self, workflow_id: int) -> None:
        super().__init__(
            f"no workflow with id {workflow_id} (never created, not committed, or deleted)"
        )
        self.workflow_id = workflow_id


class WorkflowNotFinishedError(JobQueueError):
    """The workflow still has jobs that have not ended: cancel it (and let its running jobs
    stop) before deleting it, or delete with ``force``."""

    def __init__(self, workflow_id: int, unfinished: int, *, running: bool = False) -> None:
        what = (
            "running (a worker holds them: cancel, and wait for them to stop)"
            if running
            else ("waiting, queued or running (cancel it first, or delete with force)")
        )
        super().__init__(f"workflow {workflow_id} has {unfinished} jobs {what}")
        self.workflow_id = workflow_id
        self.unfinished = unfinished


class ResultTimeoutError(JobQueueError, TimeoutError):
    """A wait for a job's result ran out of time before the job ended."""

    def __init__(self, job_ids: list[int], timeout: float) -> None:
        shown = ", ".join(map(str, job_ids[:10])) + (", ..." if len(job_ids) > 10 else "")
        super().__init__(f"job {shown} had not ended after {timeout:g} s")
        self.job_ids = job_ids


class JobFailedError(JobQueueError):
    """The result of a job that did not succeed was asked for."""

    def __init__(self, job_id: int, status: str, error: object) -> None:
        why = ""
        if isinstance(error, dict) and error.get("message"):
            why = f": {error.get('type', 'error')}: {error['message']}"
        super().__init__(f"job {job_id} is {status}, with no result{why}")
        self.job_id = job_id
        self.status = status
        self.error = error


class HardTimeoutError(JobQueueError, TimeoutError):
    """The attempt was killed at its task's hard time limit.

    Never raised to a caller: a worker records it as the attempt's error (``last_error``,
    the attempt history) when it kills an attempt of a task with a ``hard_timeout``, or when
    such an attempt's process dies; the job is retried under its task's policy.
    """


class AttemptStoppedError(JobQueueError):
    """The worker stopped the attempt: its timeout ran out, it was cancelled, or its lease was
    lost.

    Never raised to a caller: what an ``async def`` handler (or a batch task's handler) gets
    at its next ``await`` when its worker cancels it, and the attempt's error (``last_error``)
    when the handler lets it through.
    """


class SwallowedError(JobQueueError):
    """A handler went on after one of its statements failed, without ``rollback()``.

    Never raised to a caller: the attempt's error (``last_error``) when a handler caught a
    database error of its session and returned as if nothing had happened; its writes are
    rolled back and the job is retried under its task's policy.
    """


class TaskDefinitionError(JobQueueError, ValueError):
    """A task is declared twice or with invalid options."""


class SchemaError(JobQueueError):
    """The database does not have the schema this version of sa_jobqueue needs."""


class SchemaMissingError(SchemaError):
    """The sa_jobqueue tables are missing: run `sa-jobqueue migrate` or `alembic upgrade heads`."""


class SchemaOutdatedError(SchemaError):
    """The sa_jobqueue schema is older than this version needs: run `sa-jobqueue migrate`."""


class MigrationLockTimeoutError(SchemaError):
    """An upgrade gave up waiting for a lock on our tables: run `sa-jobqueue migrate` again.

    Each revision waits at most ``lock_timeout`` (1 s unless the session sets its own) for
    the locks it takes, rather than hold up every claim and enqueue queued behind its request
    while a long transaction keeps the table. The revision that gave up was rolled back; those
    before it are applied and recorded. Not guaranteed: that the next try gets the lock, if
    the transaction holding it is still open (see ``pg_stat_activity``).
    """


class SchemaManagedElsewhereError(SchemaError):
    """The sa_jobqueue schema was installed by another route: upgrade it the way it was installed.

    Raised instead of installing the tables a second time: our revisions are recorded in a
    version table other than the one this route keeps (an application's ``alembic_version``),
    or in none at all (``metadata.create_all``). The message says what was found and what to run.
    """


class WorkerConfigError(JobQueueError, ValueError):
    """A Worker option is out of range.

    Raised by the :class:`~sa_jobqueue.Worker` constructor before anything is started; the
    message names the option. It is a ValueError too, so code written against the ValueError
    the worker raised before keeps catching it.
    """


class WebConfigError(JobQueueError, ValueError):
    """A web dashboard option (an allowed host, a trusted origin) is not valid."""


class DatabaseUnavailableError(JobQueueError):
    """The database cannot be reached."""


class AppImportError(JobQueueError):
    """The application given as `module:attribute` could not be loaded."""
