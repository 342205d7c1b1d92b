"""An earlier import path, kept working.

These names live in :mod:`sa_jobqueue.ops`.
"""

from .ops import QueueStats, Stats, TaskRunTimes, WorkerInfo, count_purge, purge, stats

__all__ = ["QueueStats", "Stats", "TaskRunTimes", "WorkerInfo", "count_purge", "purge", "stats"]
