"""The jobs list's "act on many": chosen rows or all of a filter, confirmed, one batch a click.

``POST /jobs/bulk`` without ``confirmed`` answers with a confirmation page (a form of its
own, so it works without JavaScript) saying what would be done to how many jobs; that page
posts the same fields with ``confirmed``, and the action runs one bounded batch
(:mod:`sa_jobqueue.ops.bulk`) in a transaction of its own. One batch a click rather than a loop
of batches within the request: each click's work is bounded by the batch, not by the
history, the request ends long before the statement timeout, and the operator sees what each
click did ("more match: run again") and can stop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

from sqlalchemy import Connection
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response

from ..errors import InvalidJobError
from ..ops.bulk import (
    APPLIES_TO,
    BULK_BATCH,
    Action,
    BulkBatch,
    cancel_jobs,
    count_matching,
    delete_jobs,
    retry_jobs,
    run_jobs_now,
)
from ..ops.filters import MAX_IDS, RequeueAttempts, requeue_attempts
from . import _actions, _reads
from ._filters import JobFilter, read_filter

if TYPE_CHECKING:
    from ._pages import Dashboard

#: The count "all matching" shows goes this far, then says "over 10,000".
COUNTED: Final = 10_000

#: Each action's button and what it did to a job, in words.
LABELS: Final[dict[Action, tuple[str, str]]] = {
    "cancel": ("Cancel", "cancelled"),
    "retry": ("Retry", "queued again"),
    "delete": ("Delete", "deleted"),
    "run_now": ("Run now", "made due now"),
}

Scope = Literal["selected", "page", "all"]


@dataclass(frozen=True)
class BulkRequest:
    """What the form asks: an action, on chosen ids or on every job of ``wanted``."""

    action: Action
    scope: Scope
    wanted: JobFilter
    ids: tuple[int, ...] = ()
    attempts: RequeueAttempts = "extend"

    def hidden(self) -> list[tuple[str, str]]:
        """The request as hidden fields, for the confirmation page to post again."""
        # Not ``attempts``: the confirmation asks it of retry with a checkbox of its own.
        fields: list[tuple[str, str]] = [("action", self.action), ("scope", self.scope)]
        fields += [("id", str(i)) for i in self.ids]
        for key, value in self.wanted.query().items():
            fields += [(key, v) for v in value] if isinstance(value, list) else [(key, value)]
        return fields


def enabled(wanted: JobFilter) -> dict[Action, bool]:
    """Which actions the list's filter leaves something to do: all without a status filter,
    else those that apply to one of its statuses."""
    return {
        action: not wanted.statuses or any(s in applies for s in wanted.statuses)
        for action, applies in APPLIES_TO.items()
    }


def read_request(form: FormData) -> BulkRequest:
    """The request from the list's form or the confirmation's; InvalidJobError if malformed."""
    many = ("status", "id", "tag")
    fields = {k: v for k, v in form.items() if isinstance(v, str) and k not in many}
    statuses = [s for s in form.getlist("status") if isinstance(s, str)]
    tags = [t for t in form.getlist("tag") if isinstance(t, str)]
    # The page position does not narrow "all matching": an action applies to the filter.
    fields.pop("after", None)
    fields.pop("before", None)
    wanted = read_filter(fields, statuses, tags)
    action = fields.get("action", "")
    if action not in LABELS:
        raise InvalidJobError(f"unknown action {action[:40]!r}: expected {', '.join(LABELS)}")
    scope = fields.get("scope", "") or "selected"
    if scope not in ("selected", "page", "all"):
        raise InvalidJobError(f"scope must be selected, page or all, not {scope[:40]!r}")
    if scope == "all" and (wanted.payload is not None or wanted.tags):
        # The operations select by queue, task, status and age; a payload or tag search is
        # read a window of ids at a time, so "all of them" is not one bounded statement.
        raise InvalidJobError(
            "a payload or tag search acts on the ticked rows or the page, not on all matching"
        )
    named = "page_id" if scope == "page" else "id"
    ids: list[int] = []
    if scope != "all":
        for text in form.getlist(named):
            if not isinstance(text, str) or not text.isdigit() or len(text) > 19:
                raise InvalidJobError(f"a job id is a whole number, not {str(text)[:40]!r}")
            ids.append(int(text))
        if not ids:
            raise InvalidJobError("no job chosen: tick some rows, or choose all matching")
        if len(set(ids)) > MAX_IDS:
            raise InvalidJobError(f"at most {MAX_IDS:,} jobs at a time; choose all matching")
    attempts = requeue_attempts(fields.get("attempts") or "extend")
    return BulkRequest(
        action,
        "all" if scope == "all" else "selected",
        wanted,
        tuple(sorted(set(ids))),
        attempts,
    )


def _filters(wanted: JobFilter) -> dict[str, Any]:
    return {
        "queue": wanted.queue,
        "task": wanted.task,
        "statuses": wanted.statuses or None,
        "older_than": wanted.older_than,
    }


def count(conn: Connection, asked: BulkRequest) -> tuple[Any, int]:
    """The confirmation's ``now()`` and its count: the ids chosen, or the jobs of the filter
    the action applies to, up to :data:`COUNTED` + 1."""
    as_of = _reads.now(conn)
    if asked.scope != "all":
        return as_of, len(asked.ids)
    return as_of, count_matching(conn, asked.action, upto=COUNTED, **_filters(asked.wanted))


def apply(conn: Connection, asked: BulkRequest) -> BulkBatch:
    """One batch of the action (:mod:`sa_jobqueue.ops.bulk`), on the ids or the filter."""
    chosen: dict[str, Any] = {"ids": asked.ids} if asked.scope != "all" else {}
    if asked.scope == "all":
        chosen.update(_filters(asked.wanted))
    if asked.action == "cancel":
        return cancel_jobs(conn, **chosen)
    if asked.action == "retry":
        return retry_jobs(conn, attempts=asked.attempts, **chosen)
    if asked.action == "delete":
        return delete_jobs(conn, **chosen)
    return run_jobs_now(conn, **chosen)


def said(asked: BulkRequest, done: BulkBatch) -> _actions.Outcome:
    """What one batch did, in a sentence."""
    parts = [f"{LABELS[asked.action][1]} {done.done:,}"]
    if done.requested:
        parts.append(f"cancellation requested for {done.requested:,} running")
    if done.left:
        parts.append(
            f"{done.left:,} left as they were (not in a state this applies to, changed or"
            " locked meanwhile)"
        )
    if done.more:
        parts.append(f"more match: run again ({BULK_BATCH:,} a click)")
    return _actions.Outcome(bool(done.done or done.requested) or not done.left, "; ".join(parts))


def act(conn: Connection, asked: BulkRequest) -> _actions.Outcome:
    """One batch of the action, and what it did in a sentence."""
    return said(asked, apply(conn, asked))


async def handle(board: Dashboard, request: Request) -> Response:
    """``POST /jobs/bulk``: the confirmation page, or (``confirmed``) one batch of the action.

    A malformed request raises InvalidJobError, which the dashboard answers with a 400.
    """
    form = await board._action_form(request)
    asked = read_request(form)
    back = board.url(request, "jobs", query=asked.wanted.query())
    if form.get("confirmed") != "yes":
        as_of, matching = await board._read(count, asked)
        return board._page(
            request,
            "bulk_confirm.html",
            as_of,
            asked=asked,
            matching=matching,
            label=LABELS[asked.action][0],
            count_upto=COUNTED,
            back=back,
        )
    outcome = await board._act(act, asked)
    return board._after(request, outcome, back)
