"""Loading the user's application, ``module:attribute``, for ``sa-jobqueue worker``.

An application that fails to import is the most common first error, so the message names
the file and line of the user's own code that raised, not a line of ours or a library's.
"""

from __future__ import annotations

import importlib
import os
import sys
import sysconfig
import traceback
from pathlib import Path
from typing import Final

from ..errors import AppImportError
from ..queue import JobQueue


def load_app(spec: str) -> JobQueue:
    """Import ``module:attribute`` and return the JobQueue it names.

    When the module raises while being imported (or does not parse), the AppImportError
    names the exception and the innermost line of the application's own code it came from,
    not a line in the standard library, an installed package or sa_jobqueue.
    """
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise AppImportError(f"expected module:attribute (e.g. myapp.jobs:queue), got {spec!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would: the app lives beside us
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        reason = exc.msg if isinstance(exc, SyntaxError) else str(exc)
        first = reason.strip().splitlines()[0] if reason.strip() else ""
        raise AppImportError(
            f"cannot import {module_name!r}: {type(exc).__name__}: {first}{_where(exc)}"
        ) from exc
    try:
        app = getattr(module, attribute)
    except AttributeError:
        raise AppImportError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if not isinstance(app, JobQueue):
        raise AppImportError(f"{spec} is a {type(app).__name__}, not a sa_jobqueue.JobQueue")
    return app


def _where(exc: BaseException) -> str:
    """`` (path, line N)`` of the application's line ``exc`` came from, or "" if none is."""
    if isinstance(exc, SyntaxError) and exc.filename and exc.lineno:
        return f" ({_shown(exc.filename)}, line {exc.lineno})"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if _is_application(f.filename)]
    return f" ({_shown(frames[-1].filename)}, line {frames[-1].lineno})" if frames else ""


def _is_application(filename: str) -> bool:
    """Whether ``filename`` is the user's code: not importlib's, a library's, or ours."""
    if filename.startswith("<"):  # <frozen importlib._bootstrap>, <string>
        return False
    return not os.path.realpath(filename).startswith(_LIBRARIES)


#: The sa_jobqueue package directory (this module sits in its ``cli`` package).
_PACKAGE: Final = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Where code that is not the application's lives: the standard library, installed packages
#: and sa_jobqueue itself (installed or, in development, a checkout); each ends in a separator.
_LIBRARIES: Final = tuple(
    {
        os.path.join(os.path.realpath(directory), "")
        for directory in (
            *(sysconfig.get_path(n) for n in ("stdlib", "platstdlib", "purelib", "platlib")),
            _PACKAGE,
        )
    }
)


def _shown(filename: str) -> str:
    """A path relative to the current directory when it is below it, as the user typed it."""
    path = Path(filename).resolve()
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
