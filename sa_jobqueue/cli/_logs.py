"""The command's logging: text lines or JSON objects on stderr (the worker's children too)."""

from __future__ import annotations

import logging

from ._arguments import DEFAULT_LOG_LEVEL


def configure_logging(level: str | None, log_format: str) -> None:
    """Log to stderr at ``level``: text lines, or JSON objects with each record's fields.

    Alembic logs at INFO as it works (its plugins, each revision applied); those records are
    kept only when a level is given, so a plain ``sa-jobqueue migrate`` prints one line.
    """
    logging.getLogger("alembic").setLevel(level or "WARNING")
    handler = logging.StreamHandler()
    if log_format == "json":
        from ..observability.logs import JsonFormatter

        handler.setFormatter(JsonFormatter())
    else:
        from ..observability.logs import TextFormatter

        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level or DEFAULT_LOG_LEVEL, handlers=[handler])
