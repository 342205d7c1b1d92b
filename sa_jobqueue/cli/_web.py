"""``sa-jobqueue web``: the dashboard on its own, served by uvicorn until SIGTERM or Ctrl-C.

Starlette, Jinja2 and uvicorn (the ``web`` extra) are imported only when the command runs, so
the other commands never need them. Credentials come from the environment by preference: a
command line is visible to every user of the machine (``ps``).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from collections.abc import Callable
from typing import Final

from sqlalchemy import Engine

from ..database import check_schema, create_engine, ping
from ..errors import JobQueueError
from . import _values
from ._app import load_app

TOKEN_ENV: Final = "SA_JOBQUEUE_WEB_TOKEN"
BASIC_AUTH_ENV: Final = "SA_JOBQUEUE_WEB_BASIC_AUTH"
#: Limits for the dashboard's sessions (each page also sets its own statement timeout).
WEB_SETTINGS: Final = {"statement_timeout": "30s", "lock_timeout": "5s"}
#: Connections the server may hold: pages run in a thread pool, one connection each.
POOL_SIZE: Final = 4
#: The first segments of the dashboard's own paths, which --root-path may not start with.
OWN_SEGMENTS: Final = ("jobs", "workflows", "queues", "periodic", "purge", "static", "api")


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    database_option: Callable[[argparse.ArgumentParser], None],
) -> None:
    """Declare ``sa-jobqueue web`` and its options."""
    web = commands.add_parser(
        "web",
        help="serve the web dashboard (needs the 'web' extra)",
        description="Serve the dashboard: queues, workers, health, jobs, periodic schedules."
        " Read-only unless --allow-actions. Without a token or basic credentials anyone who"
        " reaches the address can see the jobs' payloads and errors: keep the default"
        f" 127.0.0.1, or set ${TOKEN_ENV} or ${BASIC_AUTH_ENV}.",
    )
    database_option(web)
    web.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1, this machine only)",
    )
    web.add_argument(
        "--port", type=_values.port, default=8080, help="port (default 8080; 0: any free one)"
    )
    web.add_argument(
        "--allow-actions",
        action="store_true",
        help="show the buttons that retry, cancel and purge jobs (default: read-only)",
    )
    web.add_argument(
        "--app",
        metavar="MODULE:ATTRIBUTE",
        help="your JobQueue, to show the periodic schedules' cron expressions and next ticks",
    )
    web.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV) or None,
        help=f"require this token: Authorization: Bearer, or ?token= once in a link (default"
        f" ${TOKEN_ENV}; prefer the variable, a command line is visible to other users)",
    )
    web.add_argument(
        "--basic-auth",
        default=os.environ.get(BASIC_AUTH_ENV) or None,
        metavar="USER:PASSWORD",
        help=f"require HTTP basic authentication (default ${BASIC_AUTH_ENV}; prefer the variable)",
    )
    web.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="HOST",
        help="also answer requests addressed to this name (Host header; *.example.com for the"
        " names under example.com, * for any); repeat for more (default: only the --host"
        " address and localhost, 127.0.0.1, [::1], which stops DNS rebinding)",
    )
    web.add_argument(
        "--trusted-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="also accept actions posted from pages of this origin (https://admin.example.com:"
        " the address a reverse proxy serves it under, when that proxy changes the Host);"
        " repeat for more",
    )
    web.add_argument(
        "--root-path",
        default="",
        metavar="PATH",
        help="serve the dashboard under this path prefix (/dashboard), as a reverse proxy"
        " serves it: the proxy may pass the prefix on or remove it, the dashboard answers"
        " either way and its links carry the prefix",
    )


def run_web(args: argparse.Namespace) -> int:
    """Serve the dashboard until stopped; 0 after SIGTERM or Ctrl-C."""
    try:
        import uvicorn  # noqa: F401 - what serves it, checked before anything starts

        from ..web import create_app
        from ..web._app import LOCAL_HOSTS
        from ..web._serve import CredentialsGate, basic_credentials, listen, prefix, serve
    except ImportError as exc:
        raise JobQueueError(
            f"sa-jobqueue web needs {exc.name}: pip install 'sa_jobqueue[web]'"
        ) from None
    try:
        basic = basic_credentials(args.basic_auth) if args.basic_auth else None
    except ValueError as exc:
        raise JobQueueError(f"--basic-auth / ${BASIC_AUTH_ENV}: {exc}") from None
    try:
        root = prefix(args.root_path, OWN_SEGMENTS)
    except ValueError as exc:
        raise JobQueueError(f"--root-path: {exc}") from None
    queue = load_app(args.app) if args.app else None
    engine = _web_engine(args)
    try:
        # Built first: a malformed --allowed-host or --trusted-origin is said before anything
        # connects or listens (building connects nothing).
        app = create_app(
            engine,
            allow_actions=args.allow_actions,
            queue=queue,
            allowed_hosts=[args.host, *LOCAL_HOSTS, *args.allowed_host],
            trusted_origins=args.trusted_origin,
        )
        ping(engine)
        check_schema(engine)
        try:
            sock = listen(args.host, args.port)
        except OSError as exc:
            raise JobQueueError(f"cannot listen on {args.host}:{args.port}: {exc}") from None
        guarded = (
            CredentialsGate(app, token=args.token, basic=basic) if args.token or basic else app
        )
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        print(
            f"sa-jobqueue web: http://{shown}:{port}{root}/"
            f" ({'actions on' if args.allow_actions else 'read-only'}"
            f"{', credentials required' if guarded is not app else ''}); Ctrl-C stops it",
            file=sys.stderr,
            flush=True,
        )
        if _unspecified(args.host) and not args.allowed_host:
            print(
                f"sa-jobqueue web: note: it answers only requests addressed to {args.host} or"
                " localhost; give the names it is reached by with --allowed-host",
                file=sys.stderr,
                flush=True,
            )
        if guarded is app and not _loopback(args.host):
            print(
                f"sa-jobqueue web: warning: listening on {args.host} with no credentials:"
                f" anyone who reaches it sees every job; set ${TOKEN_ENV}",
                file=sys.stderr,
                flush=True,
            )
        serve(guarded, sock, log_level=args.log_level or "WARNING", root_path=root)
    finally:
        engine.dispose()
    return 0


def _web_engine(args: argparse.Namespace) -> Engine:
    return create_engine(
        args.database_url,
        pooler=args.pooler,
        settings=WEB_SETTINGS,
        pool_size=POOL_SIZE,
        max_overflow=POOL_SIZE,
        connect_args={"application_name": "sa-jobqueue web"},
    )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _unspecified(host: str) -> bool:
    """Whether ``host`` is 0.0.0.0 or ``::``: every address of the machine, none of its names."""
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False
