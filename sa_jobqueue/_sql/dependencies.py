"""Dependencies: the edges a job waits on, and their settling when the jobs they name end.

Every statement that ends jobs (success, death, cancellation, on any path) settles their
dependents in the same statement, through the function ``sa_jobqueue_settle`` (revision
``sajq_0012``; since ``sajq_0013`` it cancels a job it cannot queue for its unique key rather
than fail): :func:`settling` wraps such an UPDATE. Enqueue adds edges with :func:`add_edges`,
after :func:`lock_dependencies` found every job named and kept it from being deleted until the
enqueue commits.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Final

from sqlalchemy import (
    CTE,
    BigInteger,
    Boolean,
    ColumnElement,
    Insert,
    Select,
    Text,
    Update,
    bindparam,
    case,
    cast,
    exists,
    func,
    literal,
    literal_column,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, array, insert

from ..models import (
    CANCELLED,
    FINISHED_STATUSES,
    dependencies_table,
    jobs_table,
)
from .arrays import id_array

#: The SQL function that settles the dependents of jobs that ended (revision sajq_0012).
SETTLE_FUNCTION: Final = "sa_jobqueue_settle"

j = jobs_table.c
e = dependencies_table.c


def _ended(status: ColumnElement[str]) -> ColumnElement[bool]:
    """``status IN ('succeeded', 'dead', 'cancelled')``, the names written out (no parameter
    to expand: the statements that carry it keep one plan)."""
    return status.in_([literal_column(f"'{name}'") for name in FINISHED_STATUSES])


def settle(ended: CTE) -> ColumnElement[Any]:
    """Settle the dependents of the jobs ``ended`` (an UPDATE's RETURNING ``id`` and ``status``)
    ended: evaluated once per statement, and only when one of them did end."""
    call = getattr(func, SETTLE_FUNCTION)(
        func.array(select(ended.c.id).scalar_subquery()),
        func.array(select(ended.c.status).scalar_subquery()),
    )
    any_ended = exists().where(_ended(ended.c.status))
    return select(case((any_ended, call), else_=literal(0))).scalar_subquery()


def settled_here() -> ColumnElement[Any]:
    """A RETURNING column that settles the dependents of the row's job if the statement ended
    it: for statements that end one job (or, as the claim, end few, seldom), called per row,
    and only for a row that ended."""
    call = getattr(func, SETTLE_FUNCTION)(array([j.id]), array([j.status]))
    return case((_ended(j.status), call), else_=literal(0)).label("settled")


def settling(stmt: Update, name: str = "ended") -> Select[Any]:
    """``stmt``, an UPDATE whose RETURNING has ``id`` and ``status``, as a SELECT of the rows it
    returns (its columns, then ``settled``) that settles the dependents of the jobs it ended."""
    ended = stmt.cte(name)
    return select(*ended.c, settle(ended).label("settled"))


@cache
def lock_dependencies() -> Select[Any]:
    """The jobs of ``:depends_on`` that exist, with their status, each kept from deletion (and
    from a change of its key) until the enqueue commits: ``FOR KEY SHARE``, which lets its
    worker renew its lease and end it. Locked in id order (the ORDER BY sorts below the
    locking step), whatever order the caller named them in."""
    return (
        select(j.id, j.status)
        .where(j.id == func.any(id_array("depends_on")))
        .order_by(j.id)
        .with_for_update(read=True, key_share=True)  # FOR KEY SHARE
    )


@cache
def add_edges() -> Insert:
    """Make each job of ``:job_ids`` wait for each of ``:depends_on``, with ``:on_failure``,
    ``:pending`` (that dependency had not ended when it was locked) and ``:recheck`` parallel
    to it. An edge with ``recheck`` is looked at again as the enqueue commits: the job it names
    may end meanwhile, in a statement that cannot see this edge yet (not so for a job enqueued
    in the same transaction, which nobody else can see, let alone end). The check locks the
    dependency FOR SHARE (revision ``sajq_0013``): checks of other enqueues never wait for it."""
    deps = (
        func.unnest(
            id_array("depends_on"),
            bindparam("on_failure", type_=ARRAY(Text)),
            bindparam("pending", type_=ARRAY(Boolean)),
            bindparam("recheck", type_=ARRAY(Boolean)),
        )
        .table_valued("dep", "policy", "unmet", "again", name="d")
        .render_derived()
    )
    jobs = func.unnest(id_array("job_ids")).table_valued("new_id", name="n").render_derived()
    # In dependency id order: the commit's checks (a deferred trigger per edge, fired in the
    # order the edges were inserted) then lock the dependencies ascending, as the enqueue's
    # own lock did (see lock_dependencies).
    rows = (
        select(jobs.c.new_id, deps.c.dep, deps.c.policy, deps.c.unmet, deps.c.again)
        .select_from(jobs.join(deps, true()))
        .order_by(deps.c.dep, jobs.c.new_id)
    )
    return insert(dependencies_table).from_select(
        ["job_id", "depends_on", "on_failure", "pending", "recheck"], rows
    )


@cache
def hold_back() -> Update:
    """Move the new jobs ``:job_ids`` to ``:b_status``: ``waiting`` (a dependency has not ended)
    or ``cancelled`` (one ended dead or cancelled, on an edge that cancels), with ``:b_error``
    (JSON text) as the reason."""
    status = bindparam("b_status", type_=Text)
    ends = status == CANCELLED
    return (
        update(jobs_table)
        .where(j.id == func.any(id_array("job_ids")))
        .values(
            status=status,
            finished_at=case((ends, func.now()), else_=None),
            last_error=case((ends, cast(bindparam("b_error", type_=Text), JSONB)), else_=None),
        )
    )


@cache
def edges_of() -> Select[Any]:
    """What job ``:job_id`` waits for, and what waits for it: (job_id, depends_on, on_failure,
    pending) rows of both kinds, the dependencies first."""
    job_id = bindparam("job_id", type_=BigInteger)
    return (
        select(e.job_id, e.depends_on, e.on_failure, e.pending)
        .where(or_(e.job_id == job_id, e.depends_on == job_id))
        .order_by(e.job_id != job_id, e.depends_on, e.job_id)
    )


@cache
def upstream_results() -> Select[Any]:
    """The id and stored result of each job ``:job_id`` depends on, in id order."""
    return (
        select(j.id, j.result)
        .select_from(dependencies_table.join(jobs_table, j.id == e.depends_on))
        .where(e.job_id == bindparam("job_id", type_=BigInteger))
        .order_by(j.id)
    )
