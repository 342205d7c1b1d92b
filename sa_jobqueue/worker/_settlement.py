"""Settlement: what an attempt's end asks to be recorded, and what was recorded. Pure.

Every path a handler runs on (a thread with its own transaction, a thread's shared group
transaction, the event loop) asks :func:`settle` the same question with what it saw: the
handler's exception (or none), whether it wrote through its session, and, for a grouped job,
whether it was told to stop and whether its statement failed unnoticed. The answer is a
:data:`Verdict`; :class:`~sa_jobqueue.worker._recorder.Recorder` writes it with one fenced
statement, and :func:`outcome_of` names the result (the name observers and metrics see) from
the job's status after that statement.

Nothing here touches the database: the fence decides in the end. A ``Complete`` verdict is
a request, and the completion may match no row (the attempt lost its lease, or the job was
cancelled), which :func:`outcome_of` then names from what it finds.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ..errors import SwallowedError, UnstorableResultError
from ..models import CANCELLED, DEAD
from ..tasks import Discard, JobContext, Retry

#: The message of the error a handler gets for writing through both of its sessions.
BOTH_SESSIONS = "a handler writes through ctx.session or ctx.async_session, not both"


@dataclass(frozen=True, slots=True)
class Complete:
    """The handler returned: mark the job succeeded.

    ``batched``: it wrote nothing through its session, so its completion can go out in one
    statement with other jobs'; otherwise the completion commits with its writes.
    """

    batched: bool


@dataclass(frozen=True, slots=True)
class Snooze:
    """The handler raised :class:`~sa_jobqueue.Retry`: run the job again later, uncounted."""

    retry: Retry


@dataclass(frozen=True, slots=True)
class Bury:
    """Move the job to dead at once, whatever attempts are left: the handler raised
    :class:`~sa_jobqueue.Discard`, or its result cannot be stored (:class:`UnstorableResultError`).
    """

    error: Discard | UnstorableResultError

    @property
    def reason(self) -> str:
        """Why, in one line: the Discard's reason, or the error's message."""
        return self.error.reason if isinstance(self.error, Discard) else str(self.error)


@dataclass(frozen=True, slots=True)
class Fail:
    """The handler failed: record the error; the job retries, or is dead if out of attempts."""

    error: BaseException


@dataclass(frozen=True, slots=True)
class Abandon:
    """A grouped handler returned after it was told to stop: cancelled, or no longer ours."""


@dataclass(frozen=True, slots=True)
class Release:
    """The handler raised after its worker's shutdown asked it to stop: hand the job back to
    the queue, this attempt uncounted, to run again at once (on another worker).

    The attempt keeps its number, which stays the fence of this attempt alone, and
    ``max_attempts`` grows by one so that the job's budget of attempts is not spent on a
    shutdown (``transitions.release_stopped``)."""


#: What an attempt's end asks to be recorded.
Verdict = Complete | Snooze | Bury | Fail | Abandon | Release

# The verdicts without a payload, made once: settling a successful job allocates nothing.
BATCHED = Complete(batched=True)
IN_TRANSACTION = Complete(batched=False)
ABANDON = Abandon()
RELEASE = Release()


class Outcome(enum.Enum):
    """What was recorded for an attempt; the value is the name observers and metrics see."""

    SUCCEEDED = "succeeded"
    RETRIED = "retried"
    DEAD = "dead"
    CANCELLED = "cancelled"
    LOST = "lost"  # the attempt was stale (lost lease, timed out) or its outcome unrecorded
    HANDED_BACK = "handed_back"  # returned to the queue uncounted, to run again


def settle(
    failure: BaseException | None,
    *,
    wrote: bool,
    grouped: bool = False,
    stop_requested: bool = False,
    aborted: bool = False,
    both_sessions: bool = False,
    shutting_down: bool = False,
) -> Verdict:
    """The verdict on an attempt, from how its handler ended and what its session saw.

    ``wrote``: its session holds writes to commit with the completion. ``grouped``: it ran in
    its thread's shared transaction, where a job told to stop is not completed (its savepoint
    is rolled back) and ``aborted`` (the shared transaction is in error although the handler
    returned) fails it as if it had raised. ``both_sessions``: an async handler used its sync
    and its async session, which fails it. ``shutting_down``: the worker's shutdown (and
    nothing else) asked the handler to stop; a handler that then raised stopped part-way
    because it was asked to, which is no fault of the job's: it is released, uncounted.
    """
    if failure is not None and shutting_down and not isinstance(failure, (Retry, Discard)):
        return RELEASE
    if failure is None and both_sessions:
        failure = RuntimeError(BOTH_SESSIONS)
    if failure is None and grouped:
        if stop_requested:
            return ABANDON
        if aborted:
            failure = SwallowedError(
                "a statement failed in the handler, which went on without rollback()"
            )
    if failure is None:
        return IN_TRANSACTION if wrote else BATCHED
    if isinstance(failure, Retry):
        return Snooze(failure)
    if isinstance(failure, Discard | UnstorableResultError):
        return Bury(failure)
    return Fail(failure)


def shutting_down(ctx: JobContext) -> bool:
    """Whether the worker's shutdown, and nothing else, asked this attempt to stop."""
    return ctx._shutdown and not ctx._stop


def outcome_of(verdict: Verdict, status: str | None) -> Outcome:
    """The outcome of writing ``verdict``, given the job's status after it (None: no row).

    No row means the fence did not match: the attempt was no longer this worker's.
    """
    if status is None:
        return Outcome.LOST
    if status == CANCELLED:
        return Outcome.CANCELLED
    if isinstance(verdict, Complete):
        return Outcome.SUCCEEDED
    if isinstance(verdict, Snooze):
        return Outcome.RETRIED
    if isinstance(verdict, Bury):
        return Outcome.DEAD
    if isinstance(verdict, Fail):
        return Outcome.DEAD if status == DEAD else Outcome.RETRIED
    if isinstance(verdict, Release):
        return Outcome.HANDED_BACK
    return Outcome.LOST
