"""What a verify run and its worker processes agree on: names, environment, app path."""

from __future__ import annotations

from typing import Final

#: The run's schema is this prefix and 12 random hex digits; nothing else is ever created.
SCHEMA_PREFIX: Final = "sa_jobqueue_verify_"
#: What the worker processes read: the schema of the run, and the pid of the verify process
#: (a worker whose parent is gone stops itself).
SCHEMA_ENV: Final = "SA_JOBQUEUE_VERIFY_SCHEMA"
PARENT_ENV: Final = "SA_JOBQUEUE_VERIFY_PARENT"
#: The queue and the task of the run. A queue name of its own: even a worker connection that
#: somehow missed the schema would claim only jobs of this queue, never yours.
QUEUE: Final = "sa_jobqueue_verify"
TASK: Final = "verify_job"
WORKER_APP: Final = "sa_jobqueue.verify.tasks:queue"


def schema_options(schema: str) -> str:
    """The startup option that puts ``schema`` first (and alone) on a connection's search_path.

    The name is checked against the pattern verify generates, so it never needs quoting.
    """
    if not (
        schema.startswith(SCHEMA_PREFIX)
        and len(schema) == len(SCHEMA_PREFIX) + 12
        and all(c in "0123456789abcdef" for c in schema.removeprefix(SCHEMA_PREFIX))
    ):
        raise ValueError(f"not a verify schema name: {schema!r}")
    return f"-c search_path={schema}"


def join_options(*parts: str | None) -> str:
    """libpq ``options`` strings joined, e.g. a URL's own with ours."""
    return " ".join(p for p in parts if p)
