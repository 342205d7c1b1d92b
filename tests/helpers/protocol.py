"""What a connection says to the server, from libpq's protocol trace: round trips, COPY data.

SQLAlchemy's cursor events see only the statements that go through its execute; the trace sees
everything psycopg sends on the connection, including what goes below SQLAlchemy (a COPY, an
INSERT sent straight to the driver) and the BEGIN and COMMIT that psycopg sends itself.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from psycopg import pq

#: Client messages after which the client waits for the server: a simple Query, the Sync that
#: ends an extended-protocol request, and CopyDone (COPY then waits for its result).
WAITS = frozenset({"Query", "Sync", "CopyDone"})


@dataclass
class Traffic:
    """The client's messages of a traced stretch: their types, in order, and the queries."""

    messages: list[str] = field(default_factory=list)
    queries: list[str] = field(default_factory=list)

    @property
    def round_trips(self) -> int:
        return sum(message in WAITS for message in self.messages)


@contextlib.contextmanager
def traced(pgconn: pq.abc.PGconn) -> Iterator[Traffic]:
    """Record what the client sends on ``pgconn`` while the block runs (filled in at its end)."""
    traffic = Traffic()
    with tempfile.TemporaryFile("w+b") as out:
        pgconn.trace(out.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            yield traffic
        finally:
            pgconn.untrace()
            out.flush()
            out.seek(0)
            for line in out.read().decode(errors="replace").splitlines():
                # Lines are "F|B <tab> length <tab> type <tab> contents": F is the client.
                fields = line.split("\t", 3)
                if len(fields) >= 3 and fields[0] == "F":
                    kind = fields[2].strip()
                    traffic.messages.append(kind)
                    if kind in ("Query", "Parse") and len(fields) == 4:
                        # Query "text"; Parse "statement name" "text" (long texts cut short).
                        text = fields[3].strip()
                        if kind == "Parse":
                            text = text.split(" ", 1)[1]
                        traffic.queries.append(text.strip('"'))


def pgconn_of(conn: sa.Connection) -> Any:
    """The libpq connection under a SQLAlchemy Connection (sync or the sync side of async)."""
    return conn.connection.driver_connection.pgconn  # type: ignore[union-attr]
