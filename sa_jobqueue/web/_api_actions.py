"""The JSON API's actions: their bodies checked, and what each does in its one transaction.

The bodies are read here into what the pages' forms give (:class:`~._bulk.BulkRequest`,
:class:`~._actions.LimitsForm`, a filter's text), and the work is the pages' own
(:mod:`._actions`, :mod:`._bulk`), so that a script and a button do the same thing. A body
that is not what a route takes raises :class:`~sa_jobqueue.errors.InvalidJobError`, which the
API answers with a 422; the checks of the values themselves are the pages' and the CLI's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from sqlalchemy import Connection

from ..errors import InvalidJobError
from ..ops.admin import get_job
from ..ops.bulk import APPLIES_TO, BulkBatch
from ..ops.filters import RequeueAttempts, check_ids, requeue_attempts
from . import _actions, _bulk
from ._filters import JobFilter, read_filter

Json = Any


def fields(body: Mapping[str, Json], allowed: Iterable[str]) -> None:
    """InvalidJobError for a field the route does not take (a typo would otherwise be
    ignored, and a filter silently widened)."""
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise InvalidJobError(
            f"unknown field {', '.join(map(repr, unknown))}: expected {', '.join(allowed)}"
        )


def text(body: Mapping[str, Json], name: str) -> str:
    """A field that is text (or absent, or null: ""); ``older_than`` may also be a number
    of seconds, read as its text."""
    value = body.get(name)
    if value is None:
        return ""
    numbers = (int, float) if name == "older_than" else ()
    if isinstance(value, bool) or not isinstance(value, (str, *numbers)):
        raise InvalidJobError(f"{name} must be text, not {type(value).__name__}")
    return str(value)


def texts(body: Mapping[str, Json], name: str) -> list[str]:
    """A field that is a list of text (or absent, or null: [])."""
    value = body.get(name)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidJobError(f"{name} must be a list of text")
    return list(value)


def attempts(body: Mapping[str, Json]) -> RequeueAttempts:
    """``attempts``: "extend" (the default) or "reset"."""
    return requeue_attempts(body.get("attempts", "extend"))


FILTER_FIELDS = ("queue", "task", "statuses", "older_than")


def job_filter(body: Mapping[str, Json]) -> JobFilter:
    """A filter of jobs as the jobs list takes it: ``queue``, ``task``, ``statuses``,
    ``older_than`` (``2h``, or seconds), each optional."""
    fields(body, FILTER_FIELDS)
    given = {name: text(body, name) for name in ("queue", "task", "older_than")}
    return read_filter(given, texts(body, "statuses"))


BULK_FIELDS = ("action", "ids", "filter", "attempts", "confirm")


def bulk_request(body: Mapping[str, Json]) -> tuple[_bulk.BulkRequest, bool]:
    """The bulk action asked, and whether it is confirmed (``"confirm": true``)."""
    fields(body, BULK_FIELDS)
    action = body.get("action")
    if action not in _bulk.LABELS:
        raise InvalidJobError(f"action must be one of {', '.join(_bulk.LABELS)}, not {action!r}")
    confirm = body.get("confirm", False)
    if not isinstance(confirm, bool):
        raise InvalidJobError(f"confirm must be true or false, not {confirm!r}")
    if ("ids" in body) == ("filter" in body):
        raise InvalidJobError("give either ids (a list of job ids) or filter (an object)")
    if "ids" in body:
        ids = tuple(check_ids(body["ids"]))
        return _bulk.BulkRequest(action, "selected", JobFilter(), ids, attempts(body)), confirm
    wanted = body["filter"]
    if not isinstance(wanted, dict):
        raise InvalidJobError("filter must be an object: queue, task, statuses, older_than")
    asked = _bulk.BulkRequest(action, "all", job_filter(wanted), (), attempts(body))
    return asked, confirm


def bulk(conn: Connection, asked: _bulk.BulkRequest) -> tuple[BulkBatch, _actions.Outcome]:
    """One batch of the bulk action, and what it did in a sentence."""
    done = _bulk.apply(conn, asked)
    return done, _bulk.said(asked, done)


def on_one(conn: Connection, action: Literal["delete", "run_now"], job_id: int) -> _actions.Outcome:
    """Delete job ``job_id``, or make it due now: the bulk action on its one id, and why not
    when it did nothing ("not_found", or "conflict" with the job's status)."""
    asked = _bulk.BulkRequest(action, "selected", JobFilter(), (job_id,))
    done = _bulk.apply(conn, asked)
    if done.done:
        return _bulk.said(asked, done)
    job = get_job(conn, job_id)
    if job is None:
        return _actions.Outcome(False, f"job {job_id}: no such job", "not_found")
    applies = "/".join(APPLIES_TO[action])
    return _actions.Outcome(
        False,
        f"job {job_id} is {job.status}: {action} applies to {applies} jobs"
        + (" due later" if action == "run_now" else "")
        + "; left as it is",
        "conflict",
    )


LIMIT_FIELDS = ("concurrency", "rate", "key_field", "key_concurrency", "key_rate")


def limits_form(body: Mapping[str, Json]) -> _actions.LimitsForm:
    """All of a queue's limits, each given (null for none): caps as integers, rates as
    ``N/PERIOD`` text, the key field as text."""
    fields(body, LIMIT_FIELDS)
    missing = [name for name in LIMIT_FIELDS if name not in body]
    if missing:
        raise InvalidJobError(
            f"give every limit, null for none (missing: {', '.join(missing)}): this sets them all"
        )
    for name in ("concurrency", "key_concurrency"):
        value = body[name]
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise InvalidJobError(f"{name} must be an integer or null, not {value!r}")
    for name in ("rate", "key_field", "key_rate"):
        if body[name] is not None and not isinstance(body[name], str):
            raise InvalidJobError(f"{name} must be text or null, not {body[name]!r}")
    typed = {name: "" if body[name] is None else str(body[name]) for name in LIMIT_FIELDS}
    return _actions.LimitsForm(**typed)


PURGE_FIELDS = ("statuses", "older_than")
