"""Creating and dropping the tests' databases on the test server.

Names are ours (``sajq_*``, with the process id), so parallel runs on one server do not collide;
the fixtures in tests/conftest.py and tests/integration/conftest.py decide when to call these.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator

import sqlalchemy as sa
from sqlalchemy.engine import URL

from sa_jobqueue.database import create_engine

_counter = itertools.count()


def admin_engine(server: URL) -> sa.Engine:
    """An engine that runs each statement on its own (CREATE DATABASE cannot run in a block)."""
    return create_engine(server, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)


def unique_name(prefix: str) -> str:
    """A database name no other test of this or another process uses."""
    return f"{prefix}{os.getpid()}_{next(_counter)}"


def recreate_database(server: URL, name: str, template: str | None = None) -> URL:
    """Drop database ``name`` if a previous run left it, and create it (from ``template``)."""
    admin = admin_engine(server)
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        create = f'CREATE DATABASE "{name}"'
        conn.execute(sa.text(create if template is None else f'{create} TEMPLATE "{template}"'))
    admin.dispose()
    return server.set(database=name)


def drop_database(server: URL, name: str) -> None:
    """Drop database ``name``, ending its connections."""
    admin = admin_engine(server)
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@contextlib.contextmanager
def cloned_database(server: URL, template: str, prefix: str = "sajq_t") -> Iterator[URL]:
    """A new database copied from ``template`` for the ``with`` block; dropped after it."""
    name = unique_name(prefix)
    admin = admin_engine(server)
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
    admin.dispose()
    try:
        yield server.set(database=name)
    finally:
        drop_database(server, name)


def url_string(url: URL) -> str:
    """A URL as a string a subprocess can take (password included)."""
    return url.render_as_string(hide_password=False)
