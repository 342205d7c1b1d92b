"""An earlier import path, kept working.

These names live in :mod:`sa_jobqueue.observability.tracing`.
"""

from .observability.tracing import TracingObserver, current_trace_context

__all__ = ["TracingObserver", "current_trace_context"]
