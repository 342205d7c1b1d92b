"""What the dashboard shows, in one table: each view's paths, its read, its page and its JSON.

A :class:`View` is one thing shown both as an HTML page and as an answer of the JSON API (or,
like the workers, by the API alone): what the request asks (parsed here once, by the shared
rules of :mod:`._filters` and :mod:`._requests`), the reader it runs in one read-only
snapshot, the template and its context for the page, and the shape of the JSON.
:class:`~._pages.Dashboard` makes a page route of each entry with a ``page`` path,
:class:`~._api.Api` an API route of each with an ``api`` one; a new view is one entry of
:data:`VIEWS`. Actions (POST) are not views: they stay with the pages and the API, whose
protections (the CSRF token, the JSON body) differ.

What a view's ``ask`` refuses is a 400 (InvalidJobError: the page says it, the API answers
``invalid_parameter``); an id no bigint holds is a 404 (PageError); a reader that returns
None answers ``missing``, a 404, on both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlencode

from sqlalchemy import Connection
from starlette.requests import Request
from starlette.responses import Response

from ..errors import InvalidJobError
from ..ops.filters import check_age
from . import _actions, _api_shapes, _bulk, _queue_reads, _reads, _requests, _workflow_svg
from . import _workflow_reads as _workflows
from ._api_shapes import Json
from ._filters import queue_name, read_filter

if TYPE_CHECKING:
    from ._pages import Dashboard

#: The reader's arguments after its connection, as a view's ``ask`` reads them.
Asked = tuple[Any, ...]

#: The query parameters of the API's ``GET /jobs``: any other is refused, so that a mistyped
#: filter (``stauts=dead``) is said rather than ignored. The pages take what their forms send.
JOB_PARAMS: Final = frozenset(
    {"queue", "task", "status", "tag", "older_than", "order", "after", "before", "limit"}
)


@dataclass(frozen=True)
class View:
    """One thing the dashboard shows: asked, read once, answered as a page and as JSON."""

    #: The page route's name, which links ask for (``url("jobs")``).
    name: str
    #: ``ask(request, board)``: the reader's arguments from the request.
    ask: Callable[[Request, Dashboard], Asked]
    #: ``read(conn, *asked)``, in the page's one read-only transaction.
    read: Callable[..., Any]
    #: ``shape(request, asked, data)``: the API's JSON, or a Response to send as it is.
    shape: Callable[[Request, Asked, Any], Json | Response]
    #: The page's path; None for a view the API alone answers.
    page: str | None = None
    #: The path under ``/api/v1``; None for a page alone.
    api: str | None = None
    #: The page's template; None for a page that answers the ``shape`` (a payload's JSON).
    template: str | None = None
    #: ``context(board, request, asked, data)``: the template's values, ``as_of`` among them.
    context: Callable[[Dashboard, Request, Asked, Any], dict[str, Any]] | None = None
    #: The API's own ``ask``, where it reads the request otherwise (a path, not a query).
    api_ask: Callable[[Request, Dashboard], Asked] | None = None
    #: What a 404 says when the reader finds nothing (None), formatted with ``asked``.
    missing: str | None = None


# -- what each view asks ---------------------------------------------------------------------


def _overview(request: Request, board: Dashboard) -> Asked:
    return board.thresholds, queue_name(request.query_params.get("queues_after", ""))


def _job_filter(request: Request, board: Dashboard) -> Asked:
    params = request.query_params
    return (read_filter(params, params.getlist("status"), params.getlist("tag")),)


def _api_job_filter(request: Request, board: Dashboard) -> Asked:
    unknown = sorted(set(request.query_params) - JOB_PARAMS)
    if unknown:
        raise InvalidJobError(
            f"unknown parameter {', '.join(map(repr, unknown))}: expected"
            f" {', '.join(sorted(JOB_PARAMS))}"
        )
    return _job_filter(request, board)


def _job_id(request: Request, board: Dashboard) -> Asked:
    return (_requests.job_id_of(request),)


def _workflow_id(request: Request, board: Dashboard) -> Asked:
    return (_requests.workflow_id_of(request),)


def _queue_in_query(request: Request, board: Dashboard) -> Asked:
    name = queue_name(request.query_params.get("name", ""))
    if name is None:
        raise InvalidJobError("give the queue's name: /queues?name=...")
    return name, board.thresholds.stale_after


def _queue_in_path(request: Request, board: Dashboard) -> Asked:
    return queue_name(request.path_params["name"]), board.thresholds.stale_after


def _stale_after(request: Request, board: Dashboard) -> Asked:
    return (board.thresholds.stale_after,)


def _schedules(request: Request, board: Dashboard) -> Asked:
    return (board.schedules,)


def _purge_form(request: Request, board: Dashboard) -> Asked:
    """The purge form's choice, when one was made: the page counts what it would delete."""
    statuses, age_text = _purge_choice(request)
    return (_requests.purge_selection(statuses, age_text) if statuses or age_text else None,)


def _purge_count(request: Request, board: Dashboard) -> Asked:
    """The API counts only a whole selection: statuses and an age."""
    params = request.query_params
    return (_requests.purge_selection(params.getlist("status"), params.get("older_than", "")),)


def _purge_choice(request: Request) -> tuple[list[str], str]:
    params = request.query_params
    return params.getlist("status"), params.get("older_than", "").strip()


# -- what each view reads, beyond the readers of _reads and its siblings ----------------------


def _queue(conn: Connection, name: str, stale_after: timedelta) -> _queue_reads.QueuePage:
    return _queue_reads.read_queue(conn, name, check_age(stale_after, "stale_after"))


def _live_workers(conn: Connection, stale_after: timedelta) -> tuple[datetime, list[Any]]:
    stale = check_age(stale_after, "stale_after")
    return _reads.now(conn), _queue_reads.read_live_workers(conn, stale)


# -- the pages' contexts and the API's shapes that are more than one call ---------------------


def _jobs_context(board: Dashboard, request: Request, asked: Asked, page: Any) -> dict[str, Any]:
    (wanted,) = asked
    return {
        "as_of": page.as_of,
        "page": page,
        "wanted": wanted,
        "scan_window": _reads.SCAN_WINDOW,
        "bulk": _bulk.enabled(wanted),
        "bulk_labels": _bulk.LABELS,
    }


def _jobs_shape(request: Request, asked: Asked, page: _reads.JobPage) -> Json:
    (wanted,) = asked
    here = request.scope.get("root_path", "") + "/jobs?"
    forward = page.next_after
    back = page.previous_before
    next_url = None if forward is None else here + urlencode(wanted.query(after=forward), True)
    back_url = None if back is None else here + urlencode(wanted.query(before=back), True)
    return _api_shapes.job_page(page, next_url, back_url)


def _workflow_context(
    board: Dashboard, request: Request, asked: Asked, graph: _workflows.Workflow
) -> dict[str, Any]:
    # Every link of the view is this prefix and an id: one route lookup, not 400.
    job_href = board.url(request, "job", job_id=0).removesuffix("0")
    return {
        "as_of": graph.as_of,
        "graph": graph,
        "drawing": _workflow_svg.svg_body(graph, job_href),
        "layer_lines": _workflow_svg.layer_items(graph, job_href),
    }


def _payload(request: Request, asked: Asked, text: str) -> Response:
    # JSON, never HTML: nosniff (from the guard) stops a browser from guessing otherwise.
    return Response(text, media_type="application/json")


def _purge_context(
    board: Dashboard, request: Request, asked: Asked, data: tuple[Any, int | None]
) -> dict[str, Any]:
    statuses, age_text = _purge_choice(request)
    as_of, matching = data
    chosen = {"statuses": statuses or [], "older_than": age_text}
    return {"as_of": as_of, "chosen": chosen, "matching": matching}


def _purge_shape(request: Request, asked: Asked, data: tuple[Any, int | None]) -> Json:
    (selection,) = asked
    as_of, matching = data
    assert matching is not None  # counted: a selection was given
    return {
        "as_of": _api_shapes.moment(as_of),
        "statuses": selection["statuses"],
        "older_than_seconds": selection["older_than"].total_seconds(),
        "matching": min(matching, _actions.MAX_BATCH),
        "more": matching > _actions.MAX_BATCH,
        "batch": _actions.MAX_BATCH,
    }


def _workers_shape(request: Request, asked: Asked, data: tuple[datetime, list[Any]]) -> Json:
    as_of, live = data
    return {"as_of": _api_shapes.moment(as_of), "workers": [_api_shapes.worker(w) for w in live]}


def _data(shape: Callable[[Any], Json]) -> Callable[[Request, Asked, Any], Json]:
    """A shape of what was read alone."""
    return lambda request, asked, data: shape(data)


def _as(key: str) -> Callable[[Dashboard, Request, Asked, Any], dict[str, Any]]:
    """A template's context that is what was read, under ``key``, and its ``as_of``."""
    return lambda board, request, asked, data: {"as_of": data.as_of, key: data}


#: Every view; the pages' and the API's routes are made from it, in this order.
VIEWS: Final = (
    View(
        "overview",
        page="/",
        api="/overview",
        ask=_overview,
        read=_reads.read_overview,
        template="overview.html",
        context=_as("overview"),
        shape=_data(_api_shapes.overview),
    ),
    View(
        "workers",
        api="/workers",
        ask=_stale_after,
        read=_live_workers,
        shape=_workers_shape,
    ),
    View(
        "jobs",
        page="/jobs",
        api="/jobs",
        ask=_job_filter,
        api_ask=_api_job_filter,
        read=_reads.read_jobs,
        template="jobs.html",
        context=_jobs_context,
        shape=_jobs_shape,
    ),
    View(
        "job",
        page="/jobs/{job_id:int}",
        api="/jobs/{job_id:int}",
        ask=_job_id,
        read=_requests.job_page,
        missing="no job with id {}",
        template="job.html",
        context=lambda board, request, asked, data: {
            "as_of": data[0].as_of,
            "job": data[0],
            "links": data[1],
        },
        shape=lambda request, asked, data: _api_shapes.job_detail(*data),
    ),
    View(
        "payload",
        page="/jobs/{job_id:int}/payload.json",
        api="/jobs/{job_id:int}/payload",
        ask=_job_id,
        read=_reads.read_payload,
        missing="no job with id {}",
        shape=_payload,
    ),
    View(
        "workflow",
        page="/jobs/{job_id:int}/workflow",
        api="/jobs/{job_id:int}/workflow",
        ask=_job_id,
        read=_workflows.read_workflow,
        missing="no job with id {}",
        template="workflow.html",
        context=_workflow_context,
        shape=_data(_api_shapes.workflow),
    ),
    View(
        "workflow_page",
        page="/workflows/{workflow_id:int}",
        api="/workflows/{workflow_id:int}",
        ask=_workflow_id,
        read=_workflows.read_workflow_page,
        missing="no workflow with id {}",
        template="workflow_jobs.html",
        context=_as("page"),
        shape=_data(_api_shapes.workflow_page),
    ),
    View(
        "queue",
        page="/queues",
        api="/queues/{name}",
        ask=_queue_in_query,
        api_ask=_queue_in_path,
        read=_queue,
        template="queue.html",
        context=_as("page"),
        shape=_data(_api_shapes.queue_page),
    ),
    View(
        "periodic",
        page="/periodic",
        api="/periodic",
        ask=_schedules,
        read=_reads.read_schedules,
        template="periodic.html",
        context=_as("schedules"),
        shape=_data(_api_shapes.schedules),
    ),
    View(
        "purge_form",
        page="/purge",
        api="/purge",
        ask=_purge_form,
        api_ask=_purge_count,
        read=_requests.purge_page,
        template="purge.html",
        context=_purge_context,
        shape=_purge_shape,
    ),
)
