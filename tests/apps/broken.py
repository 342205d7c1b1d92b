"""An app module that fails while being imported (for the CLI's error handling)."""

from sa_jobqueue import JobQueue

queue = JobQueue()

raise RuntimeError("this app module is broken on purpose")
