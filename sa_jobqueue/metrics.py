"""An earlier import path, kept working.

These names live in :mod:`sa_jobqueue.observability.metrics`.
"""

from .observability.metrics import (
    MetricsServer,
    PrometheusObserver,
    QueueCollector,
    start_metrics_server,
)

__all__ = ["MetricsServer", "PrometheusObserver", "QueueCollector", "start_metrics_server"]
