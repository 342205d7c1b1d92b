"""Batched, fenced completion for handlers that did not write through their session.

A handler that never touched ``ctx.session`` has nothing to commit with its completion, so the
worker need not spend a commit (an fsync) on each such job. Its ``(job id, attempt)`` pair goes
to a :class:`Completer`, which marks many jobs succeeded in one statement, flushed when
``batch_size`` pairs have gathered or ``max_delay`` after the first one arrived.

A row another transaction holds locked is not waited for (see :data:`BUSY_RETRY`): its
completion goes out again with the next batch, and waits for the lock only after
:data:`BUSY_TRIES` tries, or when the completer closes.

What this does not change: the fence (an attempt that lost its lease matches no row and is not
completed) and at-least-once execution (a worker that dies between a handler's return and the
flush leaves the job running; it is reclaimed when its lease expires and runs again, and is
never lost).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import NamedTuple, Protocol

from .._deadlines import StopClock
from .._error_text import one_line
from ._retries import retry_with_backoff

log = logging.getLogger("sa_jobqueue.worker")

#: Completions flushed at most this long after the first of a batch arrived (seconds). Short
#: next to any lease, long next to a statement's round trip.
MAX_DELAY = 0.005
#: Most completions in one statement.
BATCH_SIZE = 1_000
#: Completions waiting at most; a handler thread blocks beyond it (backpressure).
MAX_PENDING = 10_000


#: A batch whose rows another transaction held locked is tried again this long after
#: (seconds), with what else has arrived: such a lock is a claim's, held for the rest of its
#: statement (see ``transitions.complete_many_unless_locked``).
BUSY_RETRY = MAX_DELAY
#: After this many tries that found its row locked, a completion waits for the lock.
BUSY_TRIES = 20

_Pair = tuple[int, int]  # (job id, attempt)


class Flushed(NamedTuple):
    """What one flush wrote: the ids it completed, and the pairs whose rows another
    transaction held locked (neither completed nor stale: tried again in a later batch)."""

    done: set[int]
    busy: list[_Pair]


class Flush(Protocol):
    """Completes a batch of ``(job id, attempt)`` pairs (fenced): the job ids that matched, or
    a :class:`Flushed`. With ``wait`` false it may pass over rows locked by another
    transaction (``Flushed.busy``); with ``wait`` it waits for their locks."""

    def __call__(self, batch: list[_Pair], *, wait: bool) -> set[int] | Flushed: ...


class Completer:
    """A thread that completes jobs in batches; :meth:`add` from any thread, :meth:`close` once.

    ``flush`` writes one batch (the worker's: one fenced ``complete_many`` statement); the
    callbacks hear what became of each pair. What it does not promise: that a pair added is
    ever written (the process may die first; the job's lease then expires and it runs again).
    """

    def __init__(
        self,
        flush: Flush,
        on_not_completed: Callable[[int, int], None],
        on_completed: Callable[[list[tuple[int, int]]], None] | None = None,
        on_unrecorded: Callable[[list[tuple[int, int]]], None] | None = None,
        *,
        batch_size: int = BATCH_SIZE,
        max_delay: float = MAX_DELAY,
        on_flushed: Callable[[], None] | None = None,
        retry_for: float = 0.0,
        retryable: Callable[[Exception], bool] = lambda exc: True,
        clock: StopClock | None = None,
    ) -> None:
        self._complete = flush
        self._retry_for = retry_for
        self._clock = clock
        self._retryable = retryable
        # Cleared while a failed batch is being retried: add() waits meanwhile (see there).
        self._flowing = threading.Event()
        self._flowing.set()
        self._on_not_completed = on_not_completed
        self._on_completed = on_completed
        self._on_unrecorded = on_unrecorded
        self._batch_size = batch_size
        self._max_delay = max_delay
        self._pending: queue.Queue[tuple[int, int] | None] = queue.Queue(MAX_PENDING)
        self._at_once = threading.Event()
        self._lock = threading.Lock()
        self._waiting: dict[tuple[int, int], threading.Event] = {}
        # Completions added and not yet written (or failed): see :meth:`pending`.
        self._in_flight = 0
        self._on_flushed = on_flushed
        self._thread = threading.Thread(
            target=self._loop, name="sa_jobqueue-completer", daemon=True
        )
        self._thread.start()

    def add(self, job_id: int, attempt: int) -> None:
        """Queue one attempt's completion (blocks while MAX_PENDING are waiting).

        While a failed batch is being retried it also blocks, for as long as that lasts (at
        most ``retry_for`` seconds and one statement): the job thread keeps its slot
        meanwhile, so a worker whose outcomes cannot be written claims no more jobs.
        """
        self._flowing.wait()
        with self._lock:
            self._in_flight += 1
        self._pending.put((job_id, attempt))

    def try_add(self, job_id: int, attempt: int) -> bool:
        """:meth:`add` if it would not block; False (nothing queued) if it would: a failed
        batch is being retried, or MAX_PENDING completions are waiting.

        The check of the retry and the queueing are not one step: a batch that fails just
        then may get one more completion, as :meth:`add` would have given it.
        """
        if not self._flowing.is_set():
            return False
        with self._lock:
            self._in_flight += 1
        try:
            self._pending.put_nowait((job_id, attempt))
        except queue.Full:
            with self._lock:
                self._in_flight -= 1
            return False
        return True

    def pending(self) -> bool:
        """Whether completions were added that are not written yet: a burst worker does not
        stop on them, since writing one may make more work due (a job that waited for it)."""
        with self._lock:
            return self._in_flight > 0

    def add_and_wait(self, job_id: int, attempt: int, timeout: float) -> None:
        """Queue one attempt's completion, send its batch without waiting for more, and return
        once that batch has been written (or failed), or after ``timeout`` seconds.

        For a job holding a slot of a queue's cap: the slot is free for the next claim only
        once its completion has committed, so its thread lets go of the job after that.
        """
        written = threading.Event()
        with self._lock:
            self._waiting[(job_id, attempt)] = written
            self._in_flight += 1
        self._at_once.set()
        self._pending.put((job_id, attempt))
        written.wait(timeout)

    def close(self, timeout: float | None = None) -> int:
        """Flush what is pending and stop the thread; how many completions were still not
        written (nor given up on) after ``timeout`` seconds. The thread, a daemon, is then
        left to finish or not: those jobs are reclaimed once their leases expire."""
        give_up = None if timeout is None else time.monotonic() + timeout
        with contextlib.suppress(queue.Full):
            self._pending.put(None, timeout=timeout)
        self._thread.join(None if give_up is None else max(0.0, give_up - time.monotonic()))
        with self._lock:
            return self._in_flight

    def _loop(self) -> None:
        closing = False
        busy: dict[_Pair, int] = {}  # pairs whose rows were locked: how many tries so far
        while not closing or busy:
            batch = list(busy)
            if not closing:
                closing = self._gather(batch, BUSY_RETRY if busy else None)
            # Past BUSY_TRIES, or on the way out, a lock is waited for rather than tried again.
            wait = closing or any(n >= BUSY_TRIES for n in busy.values())
            still: list[_Pair] = []
            try:
                still = self._flush(batch, wait)
            except Exception as exc:  # never let the thread die: later batches must still go
                log.error("completing %d jobs failed: %s", len(batch), exc)
            finally:
                # Told before the batch stops counting as pending: a burst's claim loop that
                # finds nothing pending then finds itself woken (see ClaimLoop.run).
                if self._on_flushed is not None:
                    self._on_flushed()
                again = set(still)
                with self._lock:
                    self._in_flight -= len(batch) - len(again)
                    for pair in batch:
                        written = None if pair in again else self._waiting.pop(pair, None)
                        if written is not None:
                            written.set()
            busy = {pair: busy.get(pair, 0) + 1 for pair in still}

    def _gather(self, batch: list[_Pair], first_within: float | None) -> bool:
        """Add what arrives to ``batch``: the first pair waited for (for ``first_within``
        seconds at most, or for ever), the rest as :meth:`_loop` batches them; whether
        :meth:`close` was called."""
        try:
            first = self._pending.get(timeout=first_within)
        except queue.Empty:
            return False
        if first is None:
            return True
        batch.append(first)
        closing = False
        try:
            while len(batch) < self._batch_size:
                # What is already waiting joins the batch; more is waited for only when
                # no completion in it is wanted at once.
                wait = not self._at_once.is_set()
                item = self._pending.get(block=wait, timeout=self._max_delay if wait else None)
                if item is None:
                    closing = True
                    break
                batch.append(item)
        except queue.Empty:
            pass
        self._at_once.clear()
        return closing

    def _flush(self, batch: list[_Pair], wait: bool) -> list[_Pair]:
        """Write ``batch`` and tell the callbacks; the pairs to try again (their rows were
        locked by another transaction)."""
        try:
            flushed = self._complete_retrying(batch, wait)
        except Exception as exc:  # the jobs stay running and are reclaimed after their leases
            log.error(
                "could not record %d completions (%s); they will be retried after their"
                " leases expire",
                len(batch),
                one_line(exc),
            )
            if self._on_unrecorded is not None:
                self._on_unrecorded(batch)
            return []
        done, busy = flushed
        if self._on_completed is not None:
            try:
                self._on_completed([pair for pair in batch if pair[0] in done])
            except Exception as exc:  # an observer's trouble; the completions stand
                log.error("after completing %d jobs: %s", len(done), exc)
        again = set(busy)
        for job_id, attempt in batch:
            if job_id not in done and (job_id, attempt) not in again:
                try:
                    self._on_not_completed(job_id, attempt)
                except Exception as exc:  # the job stays as it is; its lease settles it
                    log.error("job %d: could not settle its completion: %s", job_id, exc)
        return busy

    def _complete_retrying(self, batch: list[_Pair], wait: bool) -> Flushed:
        """Complete the batch, trying again with backoff for up to ``retry_for`` seconds.

        Safe to repeat: the statement is fenced, so a try whose commit reached the server
        before its answer was lost makes the next one match nothing for those jobs (they are
        then reported as not completed, and settled by a look at their row).
        """

        def first_failure(exc: Exception) -> None:
            log.warning(
                "could not record %d completions (%s); retrying for up to %g s",
                len(batch),
                one_line(exc),
                self._retry_for,
            )
            self._flowing.clear()

        def complete() -> Flushed:
            flushed = self._complete(batch, wait=wait)
            return flushed if isinstance(flushed, Flushed) else Flushed(flushed, [])

        try:
            return retry_with_backoff(
                complete,
                self._retry_for,
                self._retryable,
                first_failure,
                self._clock,
            )
        finally:
            if not self._flowing.is_set():
                self._flowing.set()
