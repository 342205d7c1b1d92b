"""Observers: what a worker tells about its jobs; logs, metrics and traces hang off them.

An observer is the extension point for watching jobs run without touching them. Subclass
:class:`Observer`, override the hooks you need, and give instances to the worker
(``Worker(queue, engine, observers=[...])``). ``sa-jobqueue worker`` adds its own: job
records in JSON logs or at DEBUG, a span per job when the app's queue has ``tracing=True``,
Prometheus counters with ``--metrics-port``.

The hooks
=========

For every attempt a worker runs, with a :class:`JobRun` describing it::

    started(job) ──► running(job), a context manager around the handler ──► finished(job, ...)

``lease_lost(job)`` may come in between. ``finished(job, outcome, run_time, error)`` comes
once per attempt, when its outcome is recorded in the database (for a batched completion,
after the batch's statement). ``run_time`` is the handler's, in seconds (None if it never
ran); ``error`` is the exception that failed it, if one did. ``outcome`` is one of
:data:`OUTCOMES`:

* ``succeeded``: the completion (and the handler's writes) committed.
* ``retried``: the attempt failed and the job is queued again after its backoff.
* ``dead``: the attempt failed and no attempt is left (or the job cannot run at all).
* ``cancelled``: the job was cancelled while it ran.
* ``lost``: the attempt lost its lease (its worker stalled, or its outcome could not be
  recorded); another attempt will run, or has run, elsewhere.
* ``handed_back``: the attempt's work was rolled back with the transaction it shared with
  other jobs, and the job was returned to the queue uncounted.

Threads
=======

Hooks run on the worker's own threads, often several at once, so an observer must be
thread-safe:

* ``started`` and ``running``: on the thread that runs the handler; for an async handler,
  the worker's event-loop thread, where other handlers' coroutines run while ``running``'s
  block is open.
* ``finished``: on the thread that recorded the outcome: the handler's (for an async
  handler, the event loop or a thread of its pool), the thread that writes batched
  completions, or the heartbeat thread for an attempt that ran past its timeout.
* ``lease_lost``: on the heartbeat thread.

What an observer must not do
============================

* Block, or do slow I/O: every hook runs in line with the work. A slow ``started`` or
  ``running`` delays the job, a slow ``finished`` delays the completions recorded after it,
  and a slow hook on the heartbeat thread delays the renewal of every lease the worker
  holds, which can cost other jobs theirs. Hand slow work to a thread of your own.
* Count on its exception doing anything: it is logged (``sa_jobqueue.worker``) and
  otherwise ignored. Observing never changes a job's fate.
* Write through the job's session or count on being inside its transaction: by the time
  ``finished`` runs, that transaction is over.

What is not promised
====================

* A ``finished`` for an attempt whose worker process dies (killed, or a second SIGTERM):
  its lease runs out, and only the next attempt is reported, by the worker that runs it.
* A ``started`` before every ``finished``: an attempt that cannot start (unknown task,
  unreadable payload) is reported only as ``finished``, ``dead``, with no run time.
* ``finished`` after ``running``'s block has closed: a timed-out attempt is reported while
  its handler may still be running.
* The list of outcomes: a later version may add one, which an observer should accept.
* Any order between attempts, or between workers.

Modules
=======

* this package: :class:`Observer`, :class:`JobRun`, :data:`OUTCOMES`, and the logging
  observer and JSON formatter of :mod:`.logs` (no optional dependency);
* :mod:`sa_jobqueue.observability.logs`: :class:`LoggingObserver`, one log record per
  transition, and :class:`JsonFormatter`;
* :mod:`sa_jobqueue.observability.metrics`: Prometheus counters, run times and queue
  depths; needs the ``metrics`` extra (``prometheus-client``);
* :mod:`sa_jobqueue.observability.tracing`: an OpenTelemetry span per attempt, linked to
  the trace that enqueued the job; needs the ``tracing`` extra (``opentelemetry-api``).

Importing this package imports neither prometheus_client nor OpenTelemetry; only the last
two modules do. ``_observer`` holds the hooks' definitions and is internal.
"""

from __future__ import annotations

from ._observer import OUTCOMES, JobRun, Observer, Observers
from .logs import JsonFormatter, LoggingObserver

__all__ = ["OUTCOMES", "JobRun", "JsonFormatter", "LoggingObserver", "Observer", "Observers"]
