"""Many new jobs by COPY: the ids and values drawn for them, then the ``COPY`` itself.

COPY has no RETURNING and evaluates no expressions, so :func:`reserve_jobs` draws the ids and
computes what :func:`.enqueue.insert_job` would (the lease's interval, a delayed due time) in
one statement first; :func:`copy_jobs` then streams the rows in text format.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Final

from psycopg import sql
from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Integer,
    Select,
    Text,
    bindparam,
    cast,
    func,
    select,
)

from ..models import jobs_table
from .clock import seconds
from .enqueue import CHANNEL, due_at

j = jobs_table.c


#: The columns a COPY of new jobs always fills, in its rows' order (see :func:`copy_jobs`).
COPY_COLUMNS: Final = ("id", "payload", "queue", "task", "priority", "max_attempts", "lease")


@cache
def reserve_jobs(schedule: str, wake: bool = False) -> Select[Any]:
    """Take ``:n`` ids for a COPY of new jobs, with the values the database computes for them.

    One row: ``ids`` (an array of ``:n`` fresh ids from the table's sequence, the order they
    were drawn in), ``lease`` (``:lease`` seconds as the interval's text, computed as
    :func:`insert_job` computes it, so the COPY stores the same interval), and with schedule
    "after" ``visible_at`` (``:delay`` seconds after ``now()``, again as :func:`insert_job`).
    COPY has no RETURNING and evaluates no expressions; this statement does both for it.

    With ``wake`` it also sends ``:queue``'s NOTIFY: in the same transaction (or savepoint) as
    the COPY that follows, so both commit or roll back together. On an autocommit connection
    the two would commit apart, the NOTIFY first; callers do not COPY there.
    """
    # The sequence's name is looked up once (an InitPlan), not once per id.
    sequence = select(func.pg_get_serial_sequence(jobs_table.name, j.id.name)).scalar_subquery()
    drawn = select(func.array_agg(func.nextval(sequence, type_=BigInteger))).select_from(
        func.generate_series(1, bindparam("n", type_=Integer))
    )
    columns: list[ColumnElement[Any]] = [
        drawn.scalar_subquery().label("ids"),
        cast(seconds("lease"), Text).label("lease"),
    ]
    if schedule == "after":
        columns.append(due_at(schedule).label("visible_at"))
    if wake:
        columns.append(func.pg_notify(CHANNEL, bindparam("queue", type_=Text)))
    return select(*columns)


@cache
def copy_jobs(
    schedule: str,
    traced: bool = False,
    backoff: bool = False,
    labels: bool = False,
    workflow: bool = False,
) -> sql.Composed:
    """``COPY sa_jobqueue_jobs (...) FROM STDIN``: one row per job, in text format.

    A row holds :data:`COPY_COLUMNS` (``id`` from :func:`reserve_jobs`, ``payload`` as JSON
    text, ``lease`` as the interval text :func:`reserve_jobs` returned), then ``visible_at``
    unless ``schedule`` is "now" (left out, the column's default is ``now()``, as
    :func:`insert_job` stores), ``trace_context`` with ``traced``, ``backoff`` with
    ``backoff``, ``tags`` (an array's text), ``meta`` and ``on_error`` with ``labels``, and
    ``workflow_id`` and ``workflow_step`` with ``workflow``. The table and column names are
    quoted as identifiers by psycopg.
    """
    names = list(COPY_COLUMNS)
    if schedule != "now":
        names.append(j.visible_at.name)
    if traced:
        names.append(j.trace_context.name)
    if backoff:
        names.append(j.backoff.name)
    if labels:
        names += [j.tags.name, j.meta.name, j.on_error.name]
    if workflow:
        names += [j.workflow_id.name, j.workflow_step.name]
    return sql.SQL("COPY {table} ({columns}) FROM STDIN").format(
        table=sql.Identifier(jobs_table.name),
        columns=sql.SQL(", ").join(sql.Identifier(name) for name in names),
    )
