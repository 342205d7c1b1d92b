"""Serving the dashboard on its own, for ``sa-jobqueue web``: credentials and the server.

:class:`CredentialsGate` asks every request for a token (``Authorization: Bearer``, or once
``?token=`` in a link, which it swaps for a cookie) or HTTP basic credentials, and refuses
without them with its sign-in page, or under the API with the API's JSON error. Mounted in an
application, the dashboard uses that application's own authentication through ``authorize``
instead, and none of this runs.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import signal
import socket
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Final
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from ._api_errors import error_response, under_api

#: The cookie that stands for the token once a link carrying ``?token=`` was opened.
SESSION_COOKIE: Final = "sajq_session"
TOKEN_PARAM: Final = "token"

_SIGN_IN: Final = """<!doctype html>
<title>Sign in · sa_jobqueue</title>
<p>This dashboard asks for credentials. Open it with <code>?token=...</code> added to its
address (the token is in <code>$SA_JOBQUEUE_WEB_TOKEN</code> where it runs), send an
<code>Authorization: Bearer</code> header, or sign in with the user and password it was given.
"""
_BEARER_CHALLENGE: Final = 'Bearer realm="sa_jobqueue"'
_BASIC_CHALLENGE: Final = 'Basic realm="sa_jobqueue", charset="UTF-8"'


class CredentialsGate:
    """ASGI middleware: lets a request through only with the token or the basic credentials.

    ``token``: accepted as ``Authorization: Bearer <token>``, as the session cookie, or in
    ``?token=`` on a GET, which is answered with the cookie and a redirect to the same address
    without it (so the token leaves the address bar and the browser's history).
    ``basic``: ``(user, password)`` for HTTP basic authentication. Either one suffices when
    both are given. Comparisons take the same time whatever the guess.
    """

    def __init__(
        self, app: ASGIApp, *, token: str | None = None, basic: tuple[str, str] | None = None
    ) -> None:
        if not token and basic is None:
            raise ValueError("give a token, basic credentials, or both")
        self.app = app
        self.token = token or None
        self.basic = basic
        self.session = (
            hmac.new(self.token.encode(), b"sa_jobqueue web session", hashlib.sha256).hexdigest()
            if self.token
            else None
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        if self._admitted(request):
            await self.app(scope, receive, send)
            return
        offered = request.query_params.get(TOKEN_PARAM)
        if (
            self.token
            and offered is not None
            and request.method in ("GET", "HEAD")
            and _same(offered, self.token)
        ):
            await self._sign_in(request)(scope, receive, send)
            return
        if under_api(scope):
            await self._api_refusal()(scope, receive, send)
            return
        headers = {"cache-control": "no-store"}
        if self.basic is not None:
            headers["www-authenticate"] = _BASIC_CHALLENGE
        await HTMLResponse(_SIGN_IN, 401, headers=headers)(scope, receive, send)

    def _api_refusal(self) -> JSONResponse:
        """The API's 401: its JSON error, the same whether credentials were missing or wrong.

        Scripts call the API: they read the status and the error's type, and a 401 names in
        ``WWW-Authenticate`` each scheme that would be accepted (RFC 9110). The pages keep
        their Basic-only challenge: a Bearer one means nothing to a browser, and Basic there
        is what makes a browser ask for the user and password.
        """
        schemes: list[str] = []
        ways: list[str] = []
        if self.token is not None:
            schemes.append(_BEARER_CHALLENGE)
            ways.append("Authorization: Bearer with the dashboard's token")
        if self.basic is not None:
            schemes.append(_BASIC_CHALLENGE)
            ways.append("Authorization: Basic with its user and password")
        return error_response(
            401,
            "not_authenticated",
            "credentials required: send " + ", or ".join(ways),
            {"cache-control": "no-store", "www-authenticate": ", ".join(schemes)},
        )

    def _admitted(self, request: Request) -> bool:
        authorization = request.headers.get("authorization", "")
        scheme, _, credentials = authorization.partition(" ")
        if self.token is not None:
            if scheme.lower() == "bearer" and _same(credentials.strip(), self.token):
                return True
            cookie = request.cookies.get(SESSION_COOKIE)
            if cookie is not None and self.session is not None and _same(cookie, self.session):
                return True
        if self.basic is not None and scheme.lower() == "basic":
            try:
                decoded = base64.b64decode(credentials.strip(), validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                return False
            user, _, password = decoded.partition(":")
            # Both compared, always: the time taken does not tell which one was wrong.
            return _same(user, self.basic[0]) & _same(password, self.basic[1])
        return False

    def _sign_in(self, request: Request) -> RedirectResponse:
        kept = [(k, v) for k, v in request.query_params.multi_items() if k != TOKEN_PARAM]
        target = request.url.path + ("?" + urlencode(kept) if kept else "")
        response = RedirectResponse(target, status_code=303)
        assert self.session is not None
        response.set_cookie(
            SESSION_COOKIE,
            self.session,
            path=request.scope.get("root_path", "") or "/",
            httponly=True,
            samesite="lax",
            secure=request.url.scheme == "https",
        )
        return response


class UnderPrefix:
    """ASGI middleware: ``app`` served under ``prefix`` (``/dashboard``), whoever removed it.

    A request under the prefix (opened directly, or through a proxy that passes the path on
    as it came) is served as it is; any other path is taken as one a proxy removed the prefix
    from (uvicorn's ``--root-path`` convention) and served as if under it. Either way the app
    sees ``root_path`` set to the prefix, so its links carry it. A prefix whose first segment
    is one of the app's own (``/jobs``) would make the two readings collide; :func:`prefix`
    refuses it.
    """

    def __init__(self, app: ASGIApp, prefix: str) -> None:
        self.app = app
        self.prefix = prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            path: str = scope["path"]
            raw: bytes | None = scope.get("raw_path")
            if path != self.prefix and not path.startswith(self.prefix + "/"):
                path = self.prefix + path
                raw = None if raw is None else self.prefix.encode() + raw
            scope = {
                **scope,
                "root_path": scope.get("root_path", "") + self.prefix,
                "path": path,
                "raw_path": raw,
            }
        await self.app(scope, receive, send)


def prefix(text: str, taken: Iterable[str]) -> str:
    """``text`` as a path prefix: ``/a/b``, or "" for none; ValueError saying what is wrong.

    ``taken`` are the first segments of the app's own paths, which a prefix may not start
    with (see :class:`UnderPrefix`).
    """
    cleaned = text.strip().rstrip("/")
    if not cleaned:
        return ""
    if not cleaned.startswith("/") or "//" in cleaned or any(c in cleaned for c in "?#% "):
        raise ValueError(f"{text!r} is not a path prefix like /dashboard")
    first = cleaned.split("/")[1]
    if first in taken:
        raise ValueError(
            f"{text!r} starts like the dashboard's own /{first} pages, which would make its"
            " addresses ambiguous: choose another, /dashboard for example"
        )
    return cleaned


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def basic_credentials(text: str) -> tuple[str, str]:
    """``user:password`` as a pair; ValueError unless both are there."""
    user, colon, password = text.partition(":")
    if not colon or not user or not password:
        raise ValueError("basic credentials are USER:PASSWORD, both non-empty")
    return user, password


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (0: any free port) and listening; OSError if it cannot.

    The connections it accepts under asyncio have Nagle's algorithm off (``TCP_NODELAY``).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not the default 0, though the kernel makes the same TCP socket either way:
    # asyncio sets TCP_NODELAY on a connection's transport only when ``sock.proto`` is
    # IPPROTO_TCP (``base_events._set_nodelay``), and ``socket.accept`` gives each accepted
    # connection the listening socket's ``proto`` as Python recorded it, so 0 here meant Nagle
    # on for every connection uvicorn served from ``sockets=[sock]`` (``loop.create_server(
    # sock=sock)``). With Nagle on, the answer to each request after the first on a kept-alive
    # connection waited for the client's delayed ACK: 40 ms on Linux. Setting the option on
    # the listening socket instead would rely on the kernel copying it to accepted sockets,
    # which Linux does and no standard promises.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def serve(app: ASGIApp, sock: socket.socket, *, log_level: str, root_path: str = "") -> None:
    """Serve ``app`` on ``sock`` with uvicorn until SIGTERM or SIGINT, then return.

    With ``root_path`` (checked by :func:`prefix`), under it: see :class:`UnderPrefix`.
    """
    import uvicorn

    config = uvicorn.Config(
        UnderPrefix(app, root_path) if root_path else app,
        log_level=log_level.lower(),
        proxy_headers=False,
        server_header=False,
        lifespan="off",
    )
    server = uvicorn.Server(config)
    with _signals_end_quietly():
        server.run(sockets=[sock])


@contextmanager
def _signals_end_quietly() -> Iterator[None]:
    """Let uvicorn's graceful stop end the command with status 0.

    Uvicorn raises the signal that stopped it again once it has stopped, for the handler that
    was there before it; here that handler does nothing, so the command returns normally.
    """
    previous: dict[signal.Signals, Any] = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous[sig] = signal.signal(sig, lambda *_: None)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
