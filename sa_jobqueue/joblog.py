"""An earlier import path, kept working.

These names live in :mod:`sa_jobqueue.observability`.
"""

from .observability.logs import JOB_LOGGER, JsonFormatter, LoggingObserver

__all__ = ["JOB_LOGGER", "JsonFormatter", "LoggingObserver"]
