"""An earlier import path, kept working.

These names live in :mod:`sa_jobqueue.ops`.
"""

from .ops import Finding, Thresholds, check, worst

__all__ = ["Finding", "Thresholds", "check", "worst"]
