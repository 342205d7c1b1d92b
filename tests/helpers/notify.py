"""Helpers for enqueue tests: the SQL an engine sends, and the notifications it commits."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg import sql
from sqlalchemy import event, func, select

from sa_jobqueue._sql.enqueue import CHANNEL


def recording(engine: sa.Engine) -> Iterator[list[str]]:
    """Every statement ``engine`` sends while the generator is suspended (a fixture body)."""
    sent: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    yield sent
    event.remove(engine, "before_cursor_execute", record)


@contextlib.contextmanager
def listening(engine: sa.Engine) -> Iterator[psycopg.Connection[Any]]:
    """A plain psycopg connection to ``engine``'s database that LISTENs on the channel."""
    _, params = engine.dialect.create_connect_args(engine.url)
    params.pop("context", None)
    with psycopg.connect(**params, autocommit=True) as conn:
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
        yield conn


_markers = itertools.count()


def notifications(listener: psycopg.Connection[Any], engine: sa.Engine) -> list[str]:
    """The payloads of the notifications committed so far and not yet read.

    Notifications arrive in commit order, so reading up to a marker committed now needs no
    fixed wait.
    """
    marker = f"~marker-{next(_markers)}"  # "~" can never start a queue name
    with engine.begin() as conn:
        conn.execute(select(func.pg_notify(CHANNEL, marker)))
    received: list[str] = []
    for notify in listener.notifies(timeout=10):
        assert notify.channel == CHANNEL
        if notify.payload == marker:
            return received
        received.append(notify.payload)
    raise AssertionError("the marker notification did not arrive within 10 s")
