"""The dashboard as a Starlette application: :func:`create_app` and the guard around it."""

from __future__ import annotations

import inspect
import secrets
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Final

from sqlalchemy import Engine
from starlette.applications import Starlette
from starlette.datastructures import MutableHeaders
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..ops.health import Thresholds
from ..queue import JobQueue
from ._pages import Dashboard, PageError

#: ``authorize(request)``: True to let the request through, False to refuse it (403).
Authorize = Callable[[Request], bool | Awaitable[bool]]

#: Headers on every response: no script, style or frame from anywhere but the dashboard itself,
#: no inline script at all, and no Referer that could carry a URL's query to another site.
SECURITY_HEADERS: Final = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self';"
        " connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}


class Guard:
    """ASGI middleware: asks ``authorize`` about each request, and adds the security headers."""

    def __init__(self, app: ASGIApp, authorize: Authorize | None) -> None:
        self.app = app
        self.authorize = authorize

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_guarded(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    if name not in headers:
                        headers[name] = value
            await send(message)

        if self.authorize is not None:
            allowed = self.authorize(Request(scope, receive))
            if inspect.isawaitable(allowed):
                allowed = await allowed
            if not allowed:
                refused = HTMLResponse(
                    "<!doctype html><title>403</title><p>Not authorized.</p>", 403
                )
                await refused(scope, receive, send_guarded)
                return
        await self.app(scope, receive, send_guarded)


def create_app(
    engine: Engine,
    *,
    allow_actions: bool = False,
    authorize: Authorize | None = None,
    queue: JobQueue | None = None,
    secret: bytes | str | None = None,
    thresholds: Thresholds | None = None,
    statement_timeout: timedelta = timedelta(seconds=15),
    title: str = "sa_jobqueue",
) -> Starlette:
    """The dashboard as an ASGI application (Starlette) reading the queue through ``engine``.

    Run it alone (``uvicorn``, or ``sa-jobqueue web``) or mount it in a Starlette or FastAPI
    application under any prefix: ``app.mount("/jobs", create_app(engine))``; its links follow
    the prefix. Pages: the overview (queues, workers, health findings), the jobs list (filters,
    keyset pages), each job, the periodic schedules, the purge form.

    ``engine`` is a synchronous SQLAlchemy Engine on PostgreSQL (psycopg 3); each page reads in
    one read-only REPEATABLE READ transaction of its own, under ``statement_timeout``.
    ``allow_actions`` turns on the buttons (retry, cancel, retry dead jobs by filter, purge):
    POST only, with a CSRF token, each one transaction. Without it every action route answers
    403 and no button is drawn. ``authorize(request)`` is asked about every request, pages and
    static files alike, and may be a coroutine function: return False to answer 403 (it must
    not read the request's body). ``queue``, the application's JobQueue, adds each periodic
    schedule's cron expression, time zone and next tick. ``secret`` signs the CSRF tokens and
    messages: give the same one to every process serving the dashboard behind one address
    (default: random per app). ``thresholds`` tune the health findings as for ``check``.

    Not promised: authentication of its own (mounted, it is exactly as open as ``authorize``
    says), or figures that agree with those a moment later: each page is one snapshot.
    """
    dashboard = Dashboard(
        engine,
        allow_actions=allow_actions,
        schedules=dict(queue.schedules) if queue is not None else None,
        secret=_secret(secret),
        thresholds=thresholds or Thresholds(),
        statement_timeout=statement_timeout,
        title=title,
    )
    return Starlette(
        routes=dashboard.routes,
        middleware=[Middleware(Guard, authorize=authorize)],
        exception_handlers={PageError: dashboard.page_error},
    )


def _secret(secret: bytes | str | None) -> bytes:
    if secret is None:
        return secrets.token_bytes(32)
    return secret.encode() if isinstance(secret, str) else bytes(secret)
