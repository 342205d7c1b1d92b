"""Helpers for testing an application's tasks: drain the queue, assert on enqueued jobs, run one.

Import them from here (``from sa_jobqueue.testing import drain, assert_enqueued, run_task``);
they are not re-exported by ``sa_jobqueue``. Nothing here needs pytest, but failed assertions
raise ``AssertionError`` with a message that lists what was found instead, and pytest hides
these helpers' own frames from the traceback.

* :func:`enqueued_jobs`, :func:`assert_enqueued`, :func:`refute_enqueued` read the jobs table
  in *your* transaction, so they see what your code enqueued before it committed.
* :func:`run_task` calls one handler in-process with a made-up :class:`~sa_jobqueue.JobContext`;
  its ``ctx.session`` writes land in your transaction, which it never commits.
* :func:`drain` runs every due job with a real :class:`~sa_jobqueue.Worker` in burst mode. The
  worker runs each job in its own transaction on its own connection, as in production, so it
  only sees **committed** jobs and rows.

A test suite that wraps each test in one transaction rolled back at the end can use the first
four as they are. ``drain`` cannot see into such a transaction (and refuses a session or
connection that has uncommitted writes, rather than find nothing or wait on its row locks):
test enqueueing with :func:`assert_enqueued` and handlers with :func:`run_task` there, and keep
``drain`` for tests that commit, on a database they clean up afterwards (delete your rows and
``sa_jobqueue_jobs``, or use a fresh database per test).

What is not promised: that a job behaves under ``drain`` exactly as under a production worker
in every detail. ``drain`` runs one job at a time (in priority, due-time, id order) and never
enqueues periodic ticks; ``run_task`` neither enforces the task's timeout nor records anything
in the jobs table.
"""

from __future__ import annotations

from ._assertions import assert_enqueued, enqueued_jobs, refute_enqueued
from ._drain import DrainResult, drain
from ._run_task import run_task

__all__ = [
    "DrainResult",
    "assert_enqueued",
    "drain",
    "enqueued_jobs",
    "refute_enqueued",
    "run_task",
]

# The private modules: ``_reading`` (the caller's connection and the job fields read),
# ``_assertions`` (enqueued_jobs and the assertions on them), ``_drain`` (drain and its
# worker bursts) and ``_run_task`` (one handler in-process).
