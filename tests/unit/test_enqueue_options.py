"""The enqueue option resolver and job preparation: task defaults, overrides, checks; no I/O."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sa_jobqueue import Backoff, InvalidJobError, JobContext, JobQueue, Task
from sa_jobqueue._durations import duration_text
from sa_jobqueue._enqueue import ResolvedOptions, new_jobs, resolve_options
from sa_jobqueue.errors import (
    InvalidNameError,
    InvalidScheduleError,
    PayloadError,
    TaskDefinitionError,
)


def handler(ctx: JobContext, payload: Any) -> None:
    """Never run: these tests only prepare jobs."""


TASK = Task(
    name="send",
    handler=handler,
    queue="mail",
    priority=5,
    max_attempts=3,
    lease=timedelta(seconds=45),
)


def by_key(payload: Any) -> str | None:
    return None if payload.get("id") is None else f"id:{payload['id']}"


KEYED = Task(name="keyed", handler=handler, unique_key=by_key)


def test_without_overrides_the_tasks_declaration_is_taken() -> None:
    options = resolve_options(TASK)
    assert options == ResolvedOptions(
        task=TASK, queue="mail", priority=5, max_attempts=3, lease=timedelta(seconds=45)
    )
    assert options.schedule == "now"
    assert options.params() == {
        "task": "send",
        "queue": "mail",
        "priority": 5,
        "max_attempts": 3,
        "lease": 45.0,
    }


def test_overrides_win_even_when_falsy() -> None:
    # Only None means "the task's": priority 0 is an override of the task's 5.
    backoff = Backoff(base=timedelta(seconds=2), jitter=0)
    options = resolve_options(
        TASK,
        run_at=timedelta(minutes=1),
        priority=0,
        queue="other",
        max_attempts=1,
        lease=timedelta(milliseconds=500),
        backoff=backoff,
    )
    assert (options.queue, options.priority, options.max_attempts) == ("other", 0, 1)
    assert options.lease == timedelta(milliseconds=500)
    assert options.backoff is backoff
    assert options.schedule == "after"
    assert options.params()["delay"] == 60.0
    assert options.params()["lease"] == 0.5


def test_run_at_chooses_how_the_due_time_is_sent() -> None:
    moment = datetime(2030, 1, 1, tzinfo=UTC)
    at = resolve_options(TASK, run_at=moment)
    assert at.schedule == "at"
    assert at.params()["run_at"] == moment
    assert "delay" not in at.params()
    assert resolve_options(TASK, run_at=timedelta(0)).schedule == "after"


def test_a_prefix_names_the_job_columns_but_not_the_due_time() -> None:
    params = resolve_options(TASK, run_at=timedelta(seconds=3)).params("b_")
    assert params == {
        "b_task": "send",
        "b_queue": "mail",
        "b_priority": 5,
        "b_max_attempts": 3,
        "b_lease": 45.0,
        "delay": 3.0,
    }


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        ({"queue": "no spaces"}, InvalidNameError, "queue name"),
        ({"priority": 40_000}, InvalidScheduleError, "priority"),
        ({"priority": True}, InvalidScheduleError, "priority"),
        ({"max_attempts": 0}, InvalidScheduleError, "max_attempts"),
        ({"lease": timedelta(0)}, InvalidScheduleError, "lease"),
        ({"lease": 30}, InvalidScheduleError, "lease"),
        ({"run_at": datetime(2030, 1, 1)}, InvalidScheduleError, "timezone-aware"),
        ({"run_at": timedelta(seconds=-1)}, InvalidScheduleError, "delay"),
        ({"run_at": "tomorrow"}, InvalidScheduleError, "run_at"),
        ({"backoff": {"base": 1}}, InvalidJobError, "backoff must be a Backoff"),
    ],
)
def test_a_bad_override_is_refused(
    overrides: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match) as raised:
        resolve_options(TASK, **overrides)
    assert type(raised.value) is error


def test_options_are_frozen() -> None:
    options = resolve_options(TASK)
    with pytest.raises(AttributeError):
        options.priority = 1  # type: ignore[misc]


# -- new_jobs -------------------------------------------------------------------------------------


def test_payloads_are_encoded_and_keys_left_empty_without_a_key_function() -> None:
    jobs = new_jobs(
        resolve_options(TASK), [{"b": 1, "a": "é"}, None], [None, None], max_payload_bytes=100
    )
    assert jobs.payloads == ['{"b":1,"a":"é"}', "null"]
    assert jobs.keys == [None, None]
    assert (jobs.task, jobs.queue, jobs.trace_context) == ("send", "mail", None)


def test_the_tasks_key_function_fills_only_the_missing_keys() -> None:
    jobs = new_jobs(
        resolve_options(KEYED),
        [{"id": 1}, {"id": 2}, {}],
        [None, "given", None],
        max_payload_bytes=100,
    )
    assert jobs.keys == ["id:1", "given", None]


def test_keys_must_run_parallel_to_payloads() -> None:
    with pytest.raises(InvalidJobError, match="unique_keys has 1 entries for 2 payloads"):
        new_jobs(resolve_options(TASK), [1, 2], [None], max_payload_bytes=100)


def test_a_bad_key_is_refused() -> None:
    with pytest.raises(InvalidJobError, match="unique key is a str"):
        new_jobs(resolve_options(TASK), [1], [7], max_payload_bytes=100)  # type: ignore[list-item]


def test_the_payload_limit_is_the_one_given() -> None:
    options = resolve_options(TASK)
    new_jobs(options, ["x" * 8], [None], max_payload_bytes=10)
    with pytest.raises(PayloadError, match="over the limit of 10"):
        new_jobs(options, ["x" * 9], [None], max_payload_bytes=10)


def test_the_trace_context_is_taken_once_for_the_batch() -> None:
    calls: list[None] = []

    def trace() -> str:
        calls.append(None)
        return '{"traceparent":"00-1-2-01"}'

    jobs = new_jobs(
        resolve_options(TASK), [1, 2, 3], [None] * 3, max_payload_bytes=100, trace_context=trace
    )
    assert len(calls) == 1
    assert jobs.trace_context == '{"traceparent":"00-1-2-01"}'


def test_job_params_carry_the_trace_and_the_jobs_own_backoff() -> None:
    backoff = Backoff(base=timedelta(seconds=2), cap=timedelta(seconds=8), jitter=0)
    jobs = new_jobs(
        resolve_options(TASK, backoff=backoff),
        [1],
        [None],
        max_payload_bytes=100,
        trace_context=lambda: "{}",
    )
    params = jobs.params("b_")
    assert params["b_trace_context"] == "{}"
    assert json.loads(params["b_backoff"]) == {"base": 2.0, "cap": 8.0, "jitter": 0.0}
    plain = new_jobs(resolve_options(TASK), [1], [None], max_payload_bytes=100).params()
    assert "backoff" not in plain
    assert "trace_context" not in plain


# -- the same rules at @task as at enqueue -------------------------------------------------------

SHARED_RULES = [
    pytest.param("backoff", 0.05, "backoff must be a Backoff (e.g. ", id="backoff-float"),
    pytest.param("backoff", {"base": 1}, "backoff must be a Backoff", id="backoff-dict"),
    pytest.param("lease", 30, "lease must be a timedelta above 0s and at most 1d, not 30", id="l"),
    pytest.param("lease", timedelta(0), "at most 1d, not 0s", id="lease-zero"),
    pytest.param("lease", timedelta(days=2), "at most 1d, not 2d", id="lease-long"),
    pytest.param("priority", 40_000, "priority must be an int", id="priority"),
    pytest.param("max_attempts", 0, "max_attempts must be an int from 1", id="max_attempts"),
    pytest.param("unique_period", 5, "unique_period must be a timedelta", id="unique_period"),
]


@pytest.mark.parametrize(("option", "value", "message"), SHARED_RULES)
def test_an_option_is_refused_at_task_as_at_enqueue_with_the_same_message(
    option: str, value: object, message: str
) -> None:
    queue = JobQueue()
    with pytest.raises(TaskDefinitionError) as declared:
        queue.task(name="declared", **{option: value})(handler)
    with pytest.raises(InvalidJobError) as enqueued:
        resolve_options(TASK, **{option: value})
    text = str(enqueued.value)
    assert message in text
    assert str(declared.value) == f"task 'declared': {text}"
    assert "\n" not in text
    assert "datetime." not in text
    assert "day, " not in text
    assert queue.tasks == {}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (5, "timeout must be a timedelta above 0s (or None), not 5"),
        (timedelta(0), "timeout must be a timedelta above 0s (or None), not 0s"),
        (timedelta(seconds=-1), "not -1s"),
    ],
)
def test_a_bad_timeout_is_a_task_definition_error(value: object, message: str) -> None:
    with pytest.raises(TaskDefinitionError, match=re.escape(message)):
        JobQueue().task(name="slow", timeout=value)(handler)  # type: ignore[call-overload]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"base": 0.05}, "Backoff.base must be a timedelta, not 0.05"),
        ({"cap": 600}, "Backoff.cap must be a timedelta, not 600"),
        ({"jitter": "0.1"}, "Backoff.jitter is a fraction from 0 to 1, not '0.1'"),
        ({"base": timedelta(0)}, "Backoff needs 0s < base <= cap"),
    ],
)
def test_a_bad_backoff_is_refused_when_it_is_made(options: dict[str, Any], message: str) -> None:
    with pytest.raises(TaskDefinitionError, match=re.escape(message)):
        Backoff(**options)


def test_durations_read_as_people_write_them() -> None:
    shown = [
        duration_text(timedelta(0)),
        duration_text(timedelta(milliseconds=500)),
        duration_text(timedelta(seconds=1.5)),
        duration_text(timedelta(seconds=90)),
        duration_text(timedelta(days=1)),
        duration_text(timedelta(days=365_000)),
        duration_text(timedelta(seconds=-5)),
    ]
    assert shown == ["0s", "500ms", "1.5s", "1m30s", "1d", "365000d", "-5s"]


# -- the options, defined once -------------------------------------------------------------------


def test_every_option_has_a_checker_and_a_resolved_field() -> None:
    from dataclasses import fields

    from sa_jobqueue._enqueue.options import CHECKS, JobOptions, ResolvedOptions

    names = set(JobOptions.__optional_keys__)
    assert set(CHECKS) == names
    assert list(CHECKS) == list(JobOptions.__annotations__)  # checked in the documented order
    assert {f.name for f in fields(ResolvedOptions)} - {"task"} == names


def test_an_unknown_option_is_a_type_error_naming_it() -> None:
    queue = JobQueue()
    queue.task(name="send")(handler)
    with pytest.raises(TypeError, match="'priorty'"):
        queue.enqueue(None, "send", {}, priorty=1)  # type: ignore[arg-type, call-arg]
    with pytest.raises(TypeError, match="'unique_key'"):
        queue.enqueue_many(None, "send", [{}], unique_key="k")  # type: ignore[arg-type, call-arg]
    with pytest.raises(TypeError, match="'nope'"):
        resolve_options(TASK, nope=1)  # type: ignore[call-arg]
