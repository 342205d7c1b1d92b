"""The verify run's workers' application under its earlier path (see
:mod:`sa_jobqueue.verify.tasks`)."""

from __future__ import annotations

from ...verify.tasks import queue as queue
