"""The enqueue wing: everything between ``JobQueue.enqueue`` (and its kin) and the rows.

Internal: its modules may change in any release; users import :class:`Enqueued` from
``sa_jobqueue`` and the option types from ``sa_jobqueue.queue``. ``JobQueue`` keeps the task
registry and thin public methods, each handing its call to an :class:`.enqueuer.Enqueuer` and
running the work it returns in a shell of :mod:`.transactions`. The steps, the first ones
without I/O:

1. :mod:`.options`: the options, defined once (:class:`JobOptions`), and
   :func:`resolve_options`, which turns a task's declaration and a call's options into a
   checked :class:`ResolvedOptions`. Every enqueue path goes through it, periodic ticks too
   (:func:`sa_jobqueue.periodic.enqueue_due`).
2. :mod:`.jobs`: payloads encoded (:func:`encode_payloads`) and unique keys settled, a
   :class:`NewJobs`; what comes back, :class:`Enqueued`.
3. :mod:`.enqueuer`: the :class:`~.enqueuer.Enqueuer`, which prepares each call (middleware, trace
   context, the two steps above) and leaves a work: a function of the Connection to write
   through. :mod:`.calls` builds the works of chains, groups and chords.
4. :mod:`.inserting` (by row, from arrays, by COPY) and :mod:`.unique` (keys held by another
   job) run the statements, and :mod:`.wakeups` sends at most one NOTIFY per queue per
   transaction.
5. :mod:`.transactions`: the caller's transaction, or one of its own for an Engine, sync or
   async.

Bad input raises in steps 1 to 3, before any SQL, so the caller's transaction stays usable.

The package exports what the rest of the package reads (:class:`Enqueued`, :func:`wake`, the
option types) and not :class:`.enqueuer.Enqueuer`: that one stands on the task registry, which
stands on :mod:`sa_jobqueue.periodic`, which enqueues through :mod:`.jobs` and :mod:`.options`,
so importing it here would close a loop (``tests/unit/test_import_cycles.py``).
"""

from __future__ import annotations

from .jobs import Enqueued, NewJobs, encode_payloads, new_jobs
from .options import (
    EnqueueManyOptions,
    EnqueueOptions,
    JobOptions,
    ResolvedOptions,
    resolve_options,
)
from .wakeups import sent_notifications, wake

__all__ = [
    "EnqueueManyOptions",
    "EnqueueOptions",
    "Enqueued",
    "JobOptions",
    "NewJobs",
    "ResolvedOptions",
    "encode_payloads",
    "new_jobs",
    "resolve_options",
    "sent_notifications",
    "wake",
]
