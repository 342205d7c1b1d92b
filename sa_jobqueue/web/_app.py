"""The dashboard as a Starlette application: :func:`create_app` and the guard around it."""

from __future__ import annotations

import inspect
import ipaddress
import re
import secrets
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Final
from urllib.parse import urlsplit

from sqlalchemy import Engine
from starlette.applications import Starlette
from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import WebConfigError
from ..ops.health import Thresholds
from ..queue import JobQueue
from ._api import Api
from ._api_errors import ApiError, api_error, error_response, http_error, under_api
from ._pages import Dashboard
from ._requests import PageError

#: ``authorize(request)``: True to let the request through, False to refuse it (403).
Authorize = Callable[[Request], bool | Awaitable[bool]]

#: Headers on every response: no script, style or frame from anywhere but the dashboard itself,
#: no inline script at all, and no Referer that could carry a URL's query to another site.
#: ``same-origin``, not ``no-referrer``: under ``no-referrer`` a browser sends ``Origin: null``
#: with every form it posts (the Fetch standard's rule for non-GET requests), and the Guard,
#: which must refuse ``null`` (a sandboxed frame or another site's page can send it), would
#: refuse the dashboard's own forms.
SECURITY_HEADERS: Final = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self';"
        " connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}


#: The Host names answered unless ``allowed_hosts`` says otherwise: this machine's own.
LOCAL_HOSTS: Final = ("localhost", "127.0.0.1", "[::1]")
#: Methods that change nothing: the only ones answered whatever their Origin.
SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})

#: A host name, or one with its leftmost labels left open (``*.example.com``): letters,
#: digits, hyphens and underscores between dots. No port, no scheme, no path.
_HOST_NAME: Final = re.compile(r"(\*\.)?[a-z0-9_-]+(\.[a-z0-9_-]+)*\.?")

_OTHER_SITE_API: Final = (
    "refused: this request was sent by a page of another site (its Origin is not this"
    " dashboard's address); add that origin to the trusted origins if it is yours"
)
_OTHER_SITE: Final = """<!doctype html><title>403</title>
<p>Refused: this request was sent by a page of another site (its Origin is not this
dashboard's address). If the dashboard is served under another address, add that origin to
its trusted origins (<code>trusted_origins</code>, <code>--trusted-origin</code>).</p>
"""


class SecurityHeaders:
    """ASGI middleware: adds :data:`SECURITY_HEADERS` to every response that lacks them."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

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

        await self.app(scope, receive, send_guarded)


class Guard:
    """ASGI middleware: refuses requests that change something from another origin, then asks
    ``authorize`` about each request.

    A request whose method is not safe (a POST) and that carries an ``Origin`` header is let
    through only when that origin is the address the request was sent to (its ``Host``) or one
    of ``trusted_origins``. Browsers send ``Origin`` with every POST; a request without one
    (curl, a script) is judged by its CSRF token alone (a form), or its JSON body (the API,
    whose refusals here are JSON errors). ``Origin: null`` (what a
    browser sends from a sandboxed frame, or from a page whose Referrer-Policy is
    ``no-referrer``) is refused. The scheme of the request's
    own origin is not compared: behind a proxy that ends TLS the dashboard sees ``http``
    where the browser wrote ``https``; the host and port are what another site cannot fake.
    """

    def __init__(
        self, app: ASGIApp, authorize: Authorize | None, trusted_origins: frozenset[str]
    ) -> None:
        self.app = app
        self.authorize = authorize
        self.trusted_origins = trusted_origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["method"] not in SAFE_METHODS and not self._same_origin(Headers(scope=scope)):
            refused: Response
            if under_api(scope):
                refused = error_response(403, "cross_origin", _OTHER_SITE_API)
            else:
                refused = HTMLResponse(_OTHER_SITE, 403)
            await refused(scope, receive, send)
            return
        if self.authorize is not None:
            allowed = self.authorize(Request(scope, receive))
            if inspect.isawaitable(allowed):
                allowed = await allowed
            if not allowed:
                denied: Response
                if under_api(scope):
                    denied = error_response(403, "not_authorized", "not authorized")
                else:
                    denied = HTMLResponse(
                        "<!doctype html><title>403</title><p>Not authorized.</p>", 403
                    )
                await denied(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _same_origin(self, headers: Headers) -> bool:
        origin = headers.get("origin")
        if origin is None:
            return True
        origin = origin.strip().lower()
        if origin in self.trusted_origins:
            return True
        parts = urlsplit(origin)
        host = headers.get("host", "").lower()
        return parts.scheme in ("http", "https") and bool(host) and parts.netloc == host


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
    allowed_hosts: Sequence[str] | None = None,
    trusted_origins: Sequence[str] = (),
) -> Starlette:
    """The dashboard as an ASGI application (Starlette) reading the queue through ``engine``.

    Run it alone (``uvicorn``, or ``sa-jobqueue web``) or mount it in a Starlette or FastAPI
    application under any prefix: ``app.mount("/jobs", create_app(engine))``; its links follow
    the prefix. Pages: the overview (queues with their limits and what holds each back, workers,
    health findings), each queue, the jobs list (filters, keyset pages), each job (with its
    kept result and its dependencies both ways), a job's workflow (the jobs joined to it by
    dependencies, drawn without script), the periodic schedules, the purge form. Under
    ``/api/v1/``, the same pages and actions as JSON, for scripts (see the reference page
    "Dashboard JSON API"): an action there needs ``allow_actions`` too, and a body sent as
    ``application/json`` in place of the forms' CSRF token.

    ``engine`` is a synchronous SQLAlchemy Engine on PostgreSQL (psycopg 3); each page reads in one
    read-only REPEATABLE READ transaction of its own, under ``statement_timeout``. ``allow_actions``
    turns on the buttons (retry, cancel, retry dead jobs by filter, purge, pause and resume a queue,
    set its limits): POST only, with a CSRF token, each one transaction. Without it every action
    route answers 403 and no button is drawn. ``authorize(request)`` is asked about every request,
    pages and static files alike, and may be a coroutine function: return False to answer 403 (it
    must not read the request's body). ``queue``, the application's JobQueue, adds each periodic
    schedule's cron expression, time zone and next tick. ``secret`` signs the CSRF tokens and
    messages: give the same one to every process serving the dashboard behind one address (default:
    random per app). ``thresholds`` tune the health findings as for ``check``.

    ``allowed_hosts``: the names the dashboard answers to, compared with each request's
    ``Host`` (Starlette's TrustedHostMiddleware; any other gets a 400): names or addresses
    without a port, ``*.example.com`` for every name under ``example.com``, ``"*"`` for any
    (when the application in front checks ``Host`` itself). Default :data:`LOCAL_HOSTS`
    (localhost, 127.0.0.1, [::1]): mounted in an application served under another name, list
    that name. This stops DNS rebinding: another site whose name was made to resolve to this
    machine reaching the dashboard from a browser here. ``trusted_origins``
    (``https://admin.example.com``): origins other than the dashboard's own address whose
    pages may send its forms; every POST whose ``Origin`` is neither is refused with a 403.
    A malformed host or origin raises :class:`~sa_jobqueue.errors.WebConfigError`.

    Not promised: authentication of its own (mounted, it is exactly as open as ``authorize``
    says), or figures that agree with those a moment later: each page is one snapshot.
    """
    hosts = _allowed_hosts(LOCAL_HOSTS if allowed_hosts is None else allowed_hosts)
    origins = _trusted_origins(trusted_origins)
    dashboard = Dashboard(
        engine,
        allow_actions=allow_actions,
        schedules=dict(queue.schedules) if queue is not None else None,
        secret=_secret(secret),
        thresholds=thresholds or Thresholds(),
        statement_timeout=statement_timeout,
        title=title,
    )
    api = Api(dashboard)
    return Starlette(
        routes=[*dashboard.routes, api.mount],
        middleware=[
            Middleware(SecurityHeaders),
            Middleware(TrustedHostMiddleware, allowed_hosts=hosts, www_redirect=False),
            Middleware(Guard, authorize=authorize, trusted_origins=origins),
        ],
        exception_handlers={
            PageError: dashboard.page_error,
            ApiError: api_error,
            HTTPException: http_error,
        },
    )


def _secret(secret: bytes | str | None) -> bytes:
    if secret is None:
        return secrets.token_bytes(32)
    return secret.encode() if isinstance(secret, str) else bytes(secret)


def _allowed_hosts(hosts: Sequence[str]) -> list[str]:
    """``hosts`` as TrustedHostMiddleware compares them: lower case, IPv6 addresses in brackets
    (as a ``Host`` header writes them); WebConfigError for one that could never match."""
    if isinstance(hosts, str):
        raise WebConfigError("allowed_hosts is a list of host names, not one string")
    checked = []
    for host in hosts:
        name = host.strip().lower() if isinstance(host, str) else ""
        if name == "*":
            checked.append(name)
            continue
        try:
            address = ipaddress.ip_address(name.strip("[]"))
        except ValueError:
            if not _HOST_NAME.fullmatch(name):
                raise WebConfigError(
                    f"allowed host {str(host)[:100]}: a host name or address, with no port"
                    " (jobs.example.com, *.example.com, 10.0.0.5, [::1]) or *"
                ) from None
            checked.append(name)
            continue
        checked.append(f"[{address}]" if address.version == 6 else str(address))
    return checked


def _trusted_origins(origins: Sequence[str]) -> frozenset[str]:
    """``origins`` in lower case, as a browser writes an ``Origin`` header; WebConfigError for
    one that is not ``scheme://host[:port]``."""
    if isinstance(origins, str):
        raise WebConfigError("trusted_origins is a list of origins, not one string")
    checked = set()
    for origin in origins:
        text = origin.strip().lower() if isinstance(origin, str) else ""
        parts = urlsplit(text)
        if (
            parts.scheme not in ("http", "https")
            or not parts.hostname
            or "@" in parts.netloc
            or parts.path not in ("", "/")
            or parts.query
            or parts.fragment
        ):
            raise WebConfigError(
                f"trusted origin {str(origin)[:100]}: scheme://host[:port], such as"
                " https://admin.example.com"
            )
        checked.add(f"{parts.scheme}://{parts.netloc}")
    return frozenset(checked)
