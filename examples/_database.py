"""Where the examples get their database: DATABASE_URL, or an embedded PostgreSQL server.

With ``DATABASE_URL`` set, that database is used as it is (the examples create and empty their
own tables in it, so point it at a throwaway database). Without it, a real PostgreSQL server
from the ``pgserver`` wheel is started with its data in ``.demo-pgdata/`` at the repository
root, each example gets a database of its own on it, and the server is stopped on exit.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg import sql

DATA_DIR = Path(__file__).resolve().parent.parent / ".demo-pgdata"


@contextmanager
def database_url(name: str) -> Iterator[str]:
    """Yield a PostgreSQL URL: $DATABASE_URL, else database ``name`` on an embedded server."""
    configured = os.environ.get("DATABASE_URL")
    if configured:
        yield configured
        return
    # pgserver asks platformdirs for a runtime directory, which containers often lack.
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    import pgserver

    server = pgserver.get_server(DATA_DIR, cleanup_mode="stop")
    try:
        with psycopg.connect(server.get_uri(), autocommit=True) as conn:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if found.fetchone() is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        yield server.get_uri(database=name)
    finally:
        server.cleanup()  # cleanup_mode="stop": stops the server, keeps the data directory
