"""The fence: every transition of a running attempt names the attempt it expects."""

from __future__ import annotations

from sqlalchemy import (
    ARRAY,
    BigInteger,
    ColumnElement,
    Integer,
    TableValuedAlias,
    Update,
    any_,
    bindparam,
    column,
    func,
)

from ..models import (
    RUNNING,
    jobs_table,
)

j = jobs_table.c


def fenced(stmt: Update) -> Update:
    return stmt.where(
        j.id == bindparam("job_id", type_=BigInteger),
        j.status == RUNNING,
        j.attempts == bindparam("attempt", type_=Integer),
    )


def held_ids() -> ColumnElement[bool]:
    """``id = ANY(:job_ids)``, said once more beside the join on :func:`held_attempts`.

    Redundant for the result, but it is what makes the planner find the rows through the
    primary key. Joined on ``unnest`` alone, whose size it cannot see, it may instead walk the
    claim index for every ``status = 'running'`` row, which, with statistics taken while the
    backlog was all queued, it believes to be one row; on a backlog of thousands that made
    every batched completion scan the backlog.
    """
    return j.id == any_(bindparam("job_ids", type_=ARRAY(BigInteger)))


def fenced_many(held: TableValuedAlias) -> tuple[ColumnElement[bool], ...]:
    """The fence of :func:`fenced`, row by row against :func:`held_attempts`."""
    return (held_ids(), j.id == held.c.id, j.attempts == held.c.attempt, j.status == RUNNING)


def held_attempts() -> TableValuedAlias:
    """``unnest(:job_ids, :attempt_list)`` as rows of (id, attempt): many fences at once."""
    return (
        func.unnest(
            bindparam("job_ids", type_=ARRAY(BigInteger)),
            bindparam("attempt_list", type_=ARRAY(Integer)),
        )
        .table_valued(column("id", BigInteger), column("attempt", Integer))
        .render_derived(name="held")
    )
