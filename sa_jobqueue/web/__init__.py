"""A web dashboard: see and steer the queue in a browser (``pip install 'sa_jobqueue[web]'``).

:func:`create_app` builds it from an engine as a Starlette (ASGI) application, to run alone or
to mount in your own Starlette or FastAPI application under any prefix; ``sa-jobqueue web``
serves it with uvicorn. Server-rendered HTML, a small script of its own for refreshing, no
JavaScript build; every page and action also as JSON under ``/api/v1/``, for scripts. Reading
needs only SELECT on sa_jobqueue's tables; actions (retry, cancel, purge, pause and resume a
queue) are off unless asked for. It answers only the host names it
is given (by default this machine's) and refuses forms posted from another origin.

This package needs the ``web`` extra (Starlette, Jinja2, python-multipart, uvicorn);
``import sa_jobqueue`` never loads it. Its modules are internal; :func:`create_app` and the
:data:`Authorize` type are the API.
"""

from __future__ import annotations

try:
    import jinja2  # noqa: F401
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - what a missing extra looks like
    raise ImportError(
        f"sa_jobqueue's web dashboard needs {exc.name}: pip install 'sa_jobqueue[web]'",
        name=exc.name,
    ) from exc

from ._app import Authorize, create_app

__all__ = ["Authorize", "create_app"]
