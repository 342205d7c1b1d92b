"""A task module that imports in the supervisor but fails in each worker process it starts.

``sa-jobqueue worker --processes N`` loads the app once in the supervisor (a typo fails
there, once); this one raises only where multiprocessing started it, so that every child
crashes at start and the supervisor's crash-loop rule is what ends the command.
"""

from __future__ import annotations

import multiprocessing

from sa_jobqueue import JobQueue

if multiprocessing.parent_process() is not None:
    raise RuntimeError("this app refuses to start in a worker process")

queue = JobQueue()
