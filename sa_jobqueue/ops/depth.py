"""Queue depth: how many jobs a claim could take now, per queue, in one cheap statement.

For pollers, dashboards and autoscalers (KEDA's PostgreSQL scaler runs :func:`depth_query`'s
text). The count is one index-only scan of the claim index: the backlog's rows, never the
finished history, so its cost follows the jobs waiting, not the table's size.

What it counts: jobs in the claim index whose time has come, that is queued jobs due now and
running jobs whose lease has expired (a claim takes them back). What it does not: jobs
scheduled for later, jobs waiting for their dependencies, and running jobs with a live lease;
nor does it subtract what a pause, a cap or a rate holds back (a paused queue's jobs still
count). It is a snapshot, counted by the database as the statement runs.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import Connection, Engine
from sqlalchemy.dialects import postgresql

from .._binds import SessionLike, connection_of
from .._sql.stats import depth_per_queue, depth_total
from .._validation import check_queue_name


def queue_depth(bind: SessionLike | Engine, queues: Iterable[str] | None = None) -> dict[str, int]:
    """Jobs a claim could take now, per queue: ``{queue: n}``, in one statement.

    With ``queues``, only those, each present (at 0 when it has none); without, every queue
    with at least one. ``bind`` is a Session or Connection (the read runs in its transaction,
    which it neither commits nor ends) or an Engine (a connection of its own, for a moment).
    A bad queue name raises InvalidNameError before any SQL. See :mod:`sa_jobqueue.ops.depth`
    for what is counted and what is not.
    """
    names = None if queues is None else [check_queue_name(q) for q in queues]
    if isinstance(bind, Engine):
        with bind.connect() as conn:
            return _read(conn, names)
    return _read(connection_of(bind), names)


def _read(conn: Connection, names: list[str] | None) -> dict[str, int]:
    statement = depth_per_queue(names is not None)
    rows = conn.execute(statement, {} if names is None else {"queues": names})
    found = {row.queue: row.jobs for row in rows}
    if names is None:
        return found
    return {name: found.get(name, 0) for name in names}


def depth_query(queues: Iterable[str]) -> str:
    """The SQL text of the total of :func:`queue_depth` over ``queues``: one row, one column.

    For tools that take a query and no parameters, such as KEDA's PostgreSQL scaler: the
    queue names are written into the text, as literals. The statement is the one
    :func:`queue_depth` sends, summed over the queues rather than grouped by them. A bad queue
    name raises InvalidNameError.
    """
    names = [check_queue_name(q) for q in queues]
    statement = depth_total().params(queues=names)
    compiled = statement.compile(
        dialect=postgresql.dialect(),  # type: ignore[no-untyped-call]  # SQLAlchemy's own
        compile_kwargs={"literal_binds": True},
    )
    return " ".join(str(compiled).split())
