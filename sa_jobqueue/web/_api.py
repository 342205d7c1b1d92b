"""The JSON API: every page's data and every action under :data:`API_PREFIX` (``/api/v1``).

The reading routes are made from the pages' own table of views (:data:`._views.VIEWS`): the
same reader, in the pages' one read-only transaction, with only the shape of the answer
differing (:mod:`._api_shapes`). The actions act with the pages' own actions, one
transaction each. Behind the same guard as the pages (``authorize``, the Host and Origin
checks), and for a request that changes something:

* actions must be allowed (``allow_actions``), else 403 ``actions_disabled``;
* its body must be sent as ``Content-Type: application/json``, else 415. A page of another
  site can make a browser send a form (form-encoded, multipart or text/plain) without
  asking, but not a JSON body: that takes a CORS preflight, which the dashboard never grants
  (it sends no CORS header at all). This stands for the forms' CSRF token, which a script
  has no page to take it from;
* a browser's ``Origin``, when sent, must be the dashboard's own address or a trusted origin.

Errors are JSON (:mod:`._api_errors`). See docs/reference/dashboard-api.md.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

from sqlalchemy.exc import DBAPIError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route, Router

from .. import __version__
from ..errors import InvalidJobError, InvalidLimitError, JobQueueError
from . import _actions, _api_actions, _api_shapes, _bulk, _pages, _requests
from ._api_errors import API_PREFIX, MAX_BODY, ApiError, Marked
from ._views import VIEWS, View

T = TypeVar("T")

#: Single-job actions taken by the route ``POST /jobs/{id}/{action}``.
JOB_ACTIONS: Final = ("cancel", "retry", "delete", "run_now")
_STATUS: Final = {"not_found": 404, "conflict": 409}


class Api:
    """The API's routes over the dashboard's engine and settings."""

    def __init__(self, board: _pages.Dashboard) -> None:
        self.board = board
        routes: list[BaseRoute] = [
            Route("/", self.index),
            *(
                Route(view.api, self._view(view), name=view.name)
                for view in VIEWS
                if view.api is not None
            ),
            Route("/queues/{name}/pause", self.pause, methods=["POST"]),
            Route("/queues/{name}/resume", self.resume, methods=["POST"]),
            Route("/queues/{name}/limits", self.set_limits, methods=["PUT"]),
            Route("/jobs/bulk", self.bulk, methods=["POST"]),
            Route("/jobs/retry_dead", self.retry_dead, methods=["POST"]),
            Route("/jobs/{job_id:int}/{action}", self.job_action, methods=["POST"]),
            Route("/workflows/{workflow_id:int}/{action}", self.workflow_action, methods=["POST"]),
            Route("/purge", self.purge, methods=["POST"]),
        ]
        self.mount = Mount(API_PREFIX, app=Marked(Router(routes)))

    # -- reads -------------------------------------------------------------------------------

    async def index(self, request: Request) -> Response:
        return JSONResponse(
            {
                "api_version": 1,
                "version": __version__,
                "actions_allowed": self.board.allow_actions,
            }
        )

    def _view(self, view: View) -> Callable[[Request], Awaitable[Response]]:
        """The API's answer for ``view``: what it asks, read as its page reads it, as JSON."""

        async def answer(request: Request) -> Response:
            try:
                asked = (view.api_ask or view.ask)(request, self.board)
            except InvalidJobError as exc:
                raise ApiError(400, "invalid_parameter", str(exc)) from None
            except _requests.PageError as exc:  # an id no bigint holds
                raise ApiError(404, "not_found", exc.message) from None
            data = await self._read(view.read, *asked)
            if data is None and view.missing is not None:
                raise ApiError(404, "not_found", view.missing.format(*asked))
            shaped = view.shape(request, asked, data)
            return shaped if isinstance(shaped, Response) else JSONResponse(shaped)

        return answer

    # -- actions -----------------------------------------------------------------------------

    async def job_action(self, request: Request) -> Response:
        body = await self._body(request)
        job_id = _job_id(request)
        action = request.path_params["action"]
        if action not in JOB_ACTIONS:
            raise ApiError(404, "not_found", f"no action {action[:40]!r}: {', '.join(JOB_ACTIONS)}")
        if action == "retry":
            _valid(_api_actions.fields, body, ("attempts",))
            attempts = _valid(_api_actions.attempts, body)
            outcome = await self._act(_actions.retry, job_id, attempts)
        else:
            _valid(_api_actions.fields, body, ())
            if action == "cancel":
                outcome = await self._act(_actions.cancel, job_id)
            else:
                outcome = await self._act(_api_actions.on_one, action, job_id)
        return _outcome(outcome)

    async def workflow_action(self, request: Request) -> Response:
        body = await self._body(request)
        workflow_id = _workflow_id(request)
        action = request.path_params["action"]
        if action not in _requests.WORKFLOW_ACTIONS:
            raise ApiError(
                404,
                "not_found",
                f"no action {action[:40]!r}: {', '.join(_requests.WORKFLOW_ACTIONS)}",
            )
        allowed = {"retry": ("attempts",), "delete": ("force",)}.get(action, ())
        _valid(_api_actions.fields, body, allowed)
        attempts = _valid(_api_actions.attempts, body) if action == "retry" else "extend"
        force = body.get("force", False)
        if not isinstance(force, bool):
            raise ApiError(422, "invalid_request", "force is true or false")
        outcome = await self._act(
            _actions.workflow_action, workflow_id, action, attempts=attempts, force=force
        )
        return _outcome(outcome)

    async def bulk(self, request: Request) -> Response:
        body = await self._body(request)
        asked, confirmed = _valid(_api_actions.bulk_request, body)
        if not confirmed:
            as_of, matching = await self._read(_bulk.count, asked)
            return JSONResponse(
                {
                    "as_of": _api_shapes.moment(as_of),
                    "confirmed": False,
                    "action": asked.action,
                    "matching": min(matching, _bulk.COUNTED),
                    "more": matching > _bulk.COUNTED,
                    "message": "nothing changed: send the same body with"
                    ' "confirm": true to run one batch',
                }
            )
        done, outcome = await self._act(_api_actions.bulk, asked)
        return JSONResponse(
            {
                "confirmed": True,
                "action": asked.action,
                "ok": outcome.ok,
                "message": outcome.text,
                "done": done.done,
                "cancel_requested": done.requested,
                "left": done.left,
                "more": done.more,
            }
        )

    async def retry_dead(self, request: Request) -> Response:
        body = await self._body(request)
        _valid(_api_actions.fields, body, ("queue", "task", "older_than", "attempts"))
        chosen = {k: body.get(k) for k in ("queue", "task", "older_than")}
        wanted = _valid(_api_actions.job_filter, chosen)
        outcome = await self._act(
            _actions.retry_matching,
            queue=wanted.queue,
            task=wanted.task,
            older_than=wanted.older_than,
            attempts=_valid(_api_actions.attempts, body),
        )
        return _outcome(outcome)

    async def pause(self, request: Request) -> Response:
        _valid(_api_actions.fields, await self._body(request), ())
        return _outcome(await self._act(_actions.pause, request.path_params["name"]))

    async def resume(self, request: Request) -> Response:
        _valid(_api_actions.fields, await self._body(request), ())
        return _outcome(await self._act(_actions.resume, request.path_params["name"]))

    async def set_limits(self, request: Request) -> Response:
        form = _valid(_api_actions.limits_form, await self._body(request))
        return _outcome(await self._act(_actions.set_limits, request.path_params["name"], form))

    async def purge(self, request: Request) -> Response:
        body = await self._body(request)
        _valid(_api_actions.fields, body, _api_actions.PURGE_FIELDS)
        statuses = _valid(_api_actions.texts, body, "statuses")
        age_text = _valid(_api_actions.text, body, "older_than")
        selection = _valid(_requests.purge_selection, statuses, age_text)
        return _outcome(await self._act(_actions.purge, **selection))

    # -- plumbing ----------------------------------------------------------------------------

    async def _read(self, reader: Callable[..., T], *args: Any) -> T:
        """``reader`` in the pages' one read-only transaction; a 503 for what the database
        refused."""
        try:
            return await self.board._read(reader, *args)
        except _requests.PageError as exc:
            raise ApiError(exc.status, "database_error", exc.message) from exc

    async def _act(self, action: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await run_in_threadpool(self._act_sync, action, *args, **kwargs)

    def _act_sync(self, action: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``action`` in a transaction of its own, committed if it returns: the pages' own,
        but with what it refuses raised as the API's error rather than said in a message."""
        board = self.board
        try:
            with board.engine.begin() as conn:
                board._limit_time(conn)
                return action(conn, *args, **kwargs)
        except DBAPIError as exc:
            raise ApiError(503, "database_error", board._explain(exc)) from exc
        except (InvalidJobError, InvalidLimitError) as exc:
            raise ApiError(422, "invalid_request", str(exc)) from None
        except JobQueueError as exc:
            raise ApiError(503, "database_error", str(exc)) from exc

    async def _body(self, request: Request) -> dict[str, Any]:
        """The JSON object an action was sent, once actions are allowed."""
        if not self.board.allow_actions:
            raise ApiError(
                403, "actions_disabled", "actions are off: the dashboard was started without them"
            )
        media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        if media != "application/json":
            raise ApiError(
                415,
                "unsupported_media_type",
                "send the body as JSON, with Content-Type: application/json",
            )
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > MAX_BODY:
                raise ApiError(413, "body_too_large", f"a body is at most {MAX_BODY:,} bytes")
        if not raw.strip():
            return {}
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            raise ApiError(400, "invalid_json", "the body is not valid JSON") from None
        if not isinstance(body, dict):
            raise ApiError(400, "invalid_json", "the body must be a JSON object")
        return body


def _param(check: Callable[..., T], *args: Any) -> T:
    """``check(*args)`` on query parameters: a 400 for what it refuses."""
    try:
        return check(*args)
    except InvalidJobError as exc:
        raise ApiError(400, "invalid_parameter", str(exc)) from None


def _valid(check: Callable[..., T], *args: Any) -> T:
    """``check(*args)`` on a body: a 422 for what it refuses."""
    try:
        return check(*args)
    except (InvalidJobError, InvalidLimitError) as exc:
        raise ApiError(422, "invalid_request", str(exc)) from None


def _outcome(outcome: _actions.Outcome) -> Response:
    """An action's answer: 200 with what it did, or its problem's status (404, 409)."""
    if outcome.problem is not None:
        raise ApiError(_STATUS[outcome.problem], outcome.problem, outcome.text)
    return JSONResponse({"ok": outcome.ok, "message": outcome.text})


def _job_id(request: Request) -> int:
    try:
        return _requests.job_id_of(request)
    except _requests.PageError as exc:
        raise ApiError(404, "not_found", exc.message) from None


def _workflow_id(request: Request) -> int:
    try:
        return _requests.workflow_id_of(request)
    except _requests.PageError as exc:
        raise ApiError(404, "not_found", exc.message) from None
