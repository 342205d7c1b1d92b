"""The JSON API's errors: one shape, ``{"error": {"type": ..., "message": ...}}``, and its status.

The types (stable words a script can test) and their status codes:

===  ==========================  =============================================================
400  ``invalid_parameter``        a query parameter (a filter, a page bound) is not valid
400  ``invalid_json``             the body is not a JSON object
401  ``not_authenticated``        ``sa-jobqueue web`` only: no token or basic credentials, or
                                  wrong ones (``_serve.CredentialsGate``)
403  ``actions_disabled``         an action, on a dashboard started without actions
403  ``cross_origin``             a request that changes something, sent by another origin
403  ``not_authorized``           ``authorize`` refused the request
404  ``not_found``                no such job or workflow, or no such route
405  ``method_not_allowed``       the route does not take this method
409  ``conflict``                 the job's (or workflow's) state does not allow the action
413  ``body_too_large``           the body is over :data:`MAX_BODY` bytes
415  ``unsupported_media_type``   an action's body is not sent as ``application/json``
422  ``invalid_request``          the body is JSON, but a field is missing, unknown or invalid
503  ``database_error``           the database refused, gave up (statement timeout), or lacks
                                  the schema this version needs
===  ==========================  =============================================================
"""

from __future__ import annotations

from typing import Final

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

#: Where the API's routes start, under the dashboard's own root: the version is in the path,
#: so that a later, incompatible one can be served beside it.
API_PREFIX: Final = "/api/v1"
#: The largest body an action takes: a bulk request of 1,000 ids is under 25 kB.
MAX_BODY: Final = 256 * 1024

#: The scope key set once a request is routed into the API.
MARK: Final = "sa_jobqueue.api"

_BY_STATUS: Final = {404: "not_found", 405: "method_not_allowed"}


class ApiError(Exception):
    """An answer of the API that is an error: its status, its type and what to do."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message


def error_response(
    status: int, kind: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    """The JSON answer for an error."""
    body = {"error": {"type": kind, "message": message}}
    return JSONResponse(body, status_code=status, headers=headers)


def under_api(scope: Scope) -> bool:
    """Whether the request's path (below wherever the dashboard is mounted) is the API's.

    Routing rewrites the scope's ``root_path`` as it goes down the mounts: past the API's
    own, the scope carries :data:`MARK` instead.
    """
    if scope.get(MARK):
        return True
    path: str = scope.get("path", "")
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return path == API_PREFIX or path.startswith(API_PREFIX + "/")


async def api_error(request: Request, exc: Exception) -> Response:
    """The answer for an :class:`ApiError`."""
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.kind, exc.message)


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's 404 and 405: typed JSON under the API, as Starlette says them elsewhere."""
    assert isinstance(exc, HTTPException)
    headers = dict(exc.headers or {})
    if under_api(request.scope):
        kind = _BY_STATUS.get(exc.status_code, "http_error")
        message = exc.detail
        if exc.status_code == 404:
            message = f"no route {request.url.path[:200]} (GET {API_PREFIX}/ answers)"
        elif exc.status_code == 405:
            allowed = headers.get("allow", "")
            message = f"{request.method} is not taken here; this route takes {allowed}"
        return error_response(exc.status_code, kind, message, headers)
    if exc.status_code in (204, 304):
        return Response(status_code=exc.status_code, headers=headers)
    return PlainTextResponse(exc.detail, status_code=exc.status_code, headers=headers)


class Marked:
    """ASGI app: ``app``, with :data:`MARK` set in the scope of each request it is given."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[MARK] = True
        await self.app(scope, receive, send)
