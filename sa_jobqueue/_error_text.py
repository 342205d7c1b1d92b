"""Errors as text: one line for logs and reports, bounded JSON for ``last_error``."""

from __future__ import annotations

import json
import traceback

from ._visible import visible

#: Longest error message and traceback kept in ``last_error`` (characters). Enough for any
#: useful traceback, small enough that a handler raising a megabyte string cannot bloat rows.
MAX_ERROR_MESSAGE = 2_000
MAX_ERROR_TRACEBACK = 20_000


def one_line(exc: BaseException) -> str:
    """The first line of an error (the driver's own message for a database error), its control
    characters written out (:func:`~sa_jobqueue._visible.visible`): for logs and reports."""
    text = str(getattr(exc, "orig", None) or exc).strip()
    return visible((text.splitlines() or [type(exc).__name__])[0][:300], lines=False)


def _clean(text: str, limit: int) -> str:
    # PostgreSQL text cannot hold NUL, and lone surrogates cannot be encoded as UTF-8.
    text = text.replace("\x00", "\N{REPLACEMENT CHARACTER}")
    text = text.encode("utf-8", "replace").decode("utf-8")
    if len(text) > limit:
        text = text[:limit] + f"... [{len(text) - limit} more characters]"
    return text


class RemoteError(Exception):
    """A handler's exception raised in another process (an attempt's child), carried back
    as its type's name, its message and its traceback, which ``last_error`` keeps as they
    were."""

    def __init__(self, kind: str, message: str, trace: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.trace = trace

    def __reduce__(self) -> tuple[type[RemoteError], tuple[str, str, str]]:
        return (RemoteError, (self.kind, str(self), self.trace))


def error_json(exc: BaseException) -> str:
    """``last_error`` for a failure: type, message and traceback, cleaned and bounded."""
    if isinstance(exc, RemoteError):
        return json.dumps(
            {
                "type": exc.kind,
                "message": _clean(str(exc), MAX_ERROR_MESSAGE),
                "traceback": _clean(exc.trace, MAX_ERROR_TRACEBACK),
            }
        )
    kind = type(exc)
    try:
        message = str(exc)
    except Exception:  # a broken __str__ must not stop us recording the failure
        message = f"<unprintable {kind.__name__}>"
    return json.dumps(
        {
            "type": f"{kind.__module__}.{kind.__qualname__}",
            "message": _clean(message, MAX_ERROR_MESSAGE),
            "traceback": _clean("".join(traceback.format_exception(exc)), MAX_ERROR_TRACEBACK),
        }
    )
