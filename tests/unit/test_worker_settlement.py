"""The settlement function: how a handler's end maps to a verdict, and a write to an outcome."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sa_jobqueue import errors
from sa_jobqueue.errors import SwallowedError
from sa_jobqueue.models import CANCELLED, DEAD, QUEUED, SUCCEEDED
from sa_jobqueue.tasks import Discard, Retry
from sa_jobqueue.worker._settlement import (
    BATCHED,
    BOTH_SESSIONS,
    IN_TRANSACTION,
    RELEASE,
    Abandon,
    Bury,
    Complete,
    Fail,
    Outcome,
    Snooze,
    outcome_of,
    settle,
)


def test_a_handler_that_returned_completes_batched_unless_it_wrote() -> None:
    assert settle(None, wrote=False) == Complete(batched=True)
    assert settle(None, wrote=True) == Complete(batched=False)
    # Made once: settling a successful job allocates nothing.
    assert settle(None, wrote=False) is BATCHED
    assert settle(None, wrote=True) is IN_TRANSACTION


def test_retry_and_discard_steer_the_job_and_other_errors_fail_it() -> None:
    retry = Retry(after=timedelta(seconds=5))
    discard = Discard("no longer wanted")
    error = ValueError("boom")
    assert settle(retry, wrote=True) == Snooze(retry)
    assert settle(discard, wrote=False) == Bury(discard)
    assert settle(error, wrote=False) == Fail(error)
    # The grouped path decides the same for a failure, whatever else it saw.
    assert settle(error, wrote=True, grouped=True, stop_requested=True, aborted=True) == Fail(error)


def test_a_grouped_job_told_to_stop_is_abandoned_not_completed() -> None:
    assert settle(None, wrote=True, grouped=True, stop_requested=True) == Abandon()
    # Outside a group the fence decides: the completion is attempted.
    assert settle(None, wrote=True, stop_requested=True) == Complete(batched=False)


def test_a_grouped_job_whose_statement_failed_unnoticed_fails() -> None:
    verdict = settle(None, wrote=True, grouped=True, aborted=True)
    assert isinstance(verdict, Fail)
    assert isinstance(verdict.error, SwallowedError)
    # Only a grouped job's transaction is looked at.
    assert settle(None, wrote=True, aborted=True) == Complete(batched=False)


def test_writing_through_both_sessions_fails_a_handler_that_returned() -> None:
    verdict = settle(None, wrote=False, both_sessions=True)
    assert isinstance(verdict, Fail)
    assert isinstance(verdict.error, RuntimeError)
    assert str(verdict.error) == BOTH_SESSIONS
    error = KeyError("first")
    assert settle(error, wrote=False, both_sessions=True) == Fail(error)  # its own error wins


@pytest.mark.parametrize(
    ("verdict", "status", "outcome"),
    [
        (Complete(batched=False), SUCCEEDED, Outcome.SUCCEEDED),
        (Complete(batched=True), None, Outcome.LOST),
        (Snooze(Retry()), QUEUED, Outcome.RETRIED),
        (Snooze(Retry()), CANCELLED, Outcome.CANCELLED),
        (Bury(Discard("unwanted")), DEAD, Outcome.DEAD),
        (Fail(ValueError()), QUEUED, Outcome.RETRIED),
        (Fail(ValueError()), DEAD, Outcome.DEAD),
        (Fail(ValueError()), CANCELLED, Outcome.CANCELLED),
        (Fail(ValueError()), None, Outcome.LOST),
        (Abandon(), CANCELLED, Outcome.CANCELLED),
        (Abandon(), None, Outcome.LOST),
    ],
)
def test_the_outcome_is_named_from_the_status_the_write_left(
    verdict: Complete | Snooze | Bury | Fail | Abandon, status: str | None, outcome: Outcome
) -> None:
    assert outcome_of(verdict, status) is outcome


def test_outcome_values_are_the_names_observers_and_metrics_see() -> None:
    assert [o.value for o in Outcome] == [
        "succeeded",
        "retried",
        "dead",
        "cancelled",
        "lost",
        "handed_back",
    ]


def test_the_errors_an_attempt_ends_with_are_stored_under_their_real_names() -> None:
    """``last_error`` keeps a failure's type as ``module.name``: the worker's own errors are
    public classes of ``sa_jobqueue.errors``, stored under the name they are defined with."""
    from sa_jobqueue._error_text import error_json
    from sa_jobqueue.errors import AttemptStoppedError, UnstorableResultError

    for kind in (SwallowedError, AttemptStoppedError, UnstorableResultError):
        assert f'"type": "sa_jobqueue.errors.{kind.__name__}"' in error_json(kind("x"))
        assert kind.__module__ == "sa_jobqueue.errors"
        assert getattr(errors, kind.__name__) is kind


def test_a_handler_stopped_by_shutdown_that_raises_is_released() -> None:
    assert settle(RuntimeError("stopped part-way"), wrote=True, shutting_down=True) is RELEASE
    assert outcome_of(RELEASE, "queued") is Outcome.HANDED_BACK
    # Returning means it finished: it completes; Retry and Discard say what they mean.
    assert settle(None, wrote=False, shutting_down=True) is BATCHED
    retry = Retry(after=timedelta(seconds=1))
    assert settle(retry, wrote=False, shutting_down=True) == Snooze(retry)
    discard = Discard("no")
    assert settle(discard, wrote=False, shutting_down=True) == Bury(discard)
