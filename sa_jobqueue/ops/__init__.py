"""Operating the queue from outside a worker: statistics, purging history, health checks.

The public operator API is what this package exports (``__all__``):

* :func:`get_job`, :func:`list_jobs`, :func:`count_jobs`, :func:`cancel_job` and
  :func:`requeue_job` (returning :class:`JobInfo`, whose :class:`JobSummary` fields the
  dashboard's views of a job share): job admin over the caller's Session or Connection, in
  its transaction; :class:`~sa_jobqueue.JobQueue` delegates to them.
* :func:`pause_queue`, :func:`resume_queue`, :func:`paused_queues`,
  :func:`set_queue_concurrency`, :func:`set_queue_key_concurrency`, :func:`set_queue_rate`,
  :func:`set_queue_key_rate` (each rate a :class:`RateLimit`), :func:`clear_queue_limits`,
  :func:`queue_limits` (returning :class:`QueueLimits`) and
  :func:`list_queues` (returning :class:`QueueInfo`): flow control per queue, cluster-wide,
  in the caller's transaction.
* :func:`get_workflow` (returning :class:`WorkflowInfo` of :class:`WorkflowJob`),
  :func:`cancel_workflow`, :func:`retry_workflow` and :func:`delete_workflow` (returning
  :class:`WorkflowChange`): a workflow's jobs, together, in the caller's transaction; what
  :class:`~sa_jobqueue.workflows.Workflow`'s methods call. A workflow has at most
  :data:`MAX_WORKFLOW_JOBS` jobs.
* :func:`requeue_dead_jobs` (returning :class:`RequeuedBatch`): retry the dead jobs
  matching a filter, one bounded batch per call, in the caller's transaction.
* :func:`queue_depth`: jobs a claim could take now, per queue, in one index-only statement
  (for pollers and dashboards); :func:`depth_query`, the same count as SQL text for an
  autoscaler (KEDA's PostgreSQL scaler).
* :func:`stats` and its result types :class:`Stats`, :class:`QueueStats`,
  :class:`TaskRunTimes` and :class:`WorkerInfo`: a read-only snapshot.
* :func:`purge` and its dry run :func:`count_purge`: deleting finished jobs in batches.
* :func:`check` with :class:`Thresholds`, returning :class:`Finding` objects; :func:`worst`
  sums them up.

The submodules are internal and may change without notice: ``admin`` (job admin),
``requeue``, ``workflows``, ``stats``, ``depth``, ``purge``, ``health``, ``queues`` (the
functions above), ``filters`` (checks of the filters callers pass), ``workers`` (each
worker's row in the registry) and ``verify`` (the run behind ``sa-jobqueue verify``). Their
statements are in :mod:`sa_jobqueue._sql`; rendering them for people is the CLI's
(:mod:`sa_jobqueue.cli`) or the dashboard's.

None of this is needed to run jobs. ``stats`` and ``check`` only read, in the connection's
current transaction, and commit nothing; ``purge`` commits each of its batches itself.
"""

from __future__ import annotations

from .admin import (
    Edge,
    JobInfo,
    JobSummary,
    cancel_job,
    count_jobs,
    get_job,
    job_edges,
    list_jobs,
    requeue_job,
)
from .depth import depth_query, queue_depth
from .health import Finding, Severity, Thresholds, check, worst
from .purge import count_purge, purge
from .queues import (
    QueueInfo,
    QueueLimits,
    RateLimit,
    clear_queue_limits,
    list_queues,
    pause_queue,
    paused_queues,
    queue_limits,
    resume_queue,
    set_queue_concurrency,
    set_queue_key_concurrency,
    set_queue_key_rate,
    set_queue_rate,
)
from .requeue import RequeuedBatch, requeue_dead_jobs
from .stats import QueueStats, Stats, TaskRunTimes, WorkerInfo, stats
from .workflows import (
    MAX_WORKFLOW_JOBS,
    WorkflowChange,
    WorkflowInfo,
    WorkflowJob,
    cancel_workflow,
    delete_workflow,
    get_workflow,
    retry_workflow,
)

__all__ = [
    "MAX_WORKFLOW_JOBS",
    "Edge",
    "Finding",
    "JobInfo",
    "JobSummary",
    "QueueInfo",
    "QueueLimits",
    "QueueStats",
    "RateLimit",
    "RequeuedBatch",
    "Severity",
    "Stats",
    "TaskRunTimes",
    "Thresholds",
    "WorkerInfo",
    "WorkflowChange",
    "WorkflowInfo",
    "WorkflowJob",
    "cancel_job",
    "cancel_workflow",
    "check",
    "clear_queue_limits",
    "count_jobs",
    "count_purge",
    "delete_workflow",
    "depth_query",
    "get_job",
    "get_workflow",
    "job_edges",
    "list_jobs",
    "list_queues",
    "pause_queue",
    "paused_queues",
    "purge",
    "queue_depth",
    "queue_limits",
    "requeue_dead_jobs",
    "requeue_job",
    "resume_queue",
    "retry_workflow",
    "set_queue_concurrency",
    "set_queue_key_concurrency",
    "set_queue_key_rate",
    "set_queue_rate",
    "stats",
    "worst",
]
