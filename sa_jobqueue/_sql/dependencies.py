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
    Integer,
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
    union_all,
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


# -- what the dashboard shows of a job's workflow --------------------------------------------


def _neighbour_list(own: Any, other: Any) -> Select[Any]:
    """The edges whose ``own`` end is ``:job_id``: the job at the ``other`` end (its task and
    status; both NULL once it was pruned), the edge's policy and whether it is pending, at most
    ``:shown`` of them in id order, from the edges' index (never more edges than that).

    The edges are chosen first, then their jobs probed: joined before the LIMIT, the planner
    may walk the jobs' primary key in id order to the first of them (a merge join).
    """
    edges = (
        select(other.label("id"), e.on_failure, e.pending)
        .where(own == bindparam("job_id", type_=BigInteger))
        .order_by(other)
        .limit(bindparam("shown", type_=Integer))
        .subquery("edges")
    )
    return (
        select(edges.c.id, j.task, j.status, edges.c.on_failure, edges.c.pending)
        .select_from(edges.outerjoin(jobs_table, j.id == edges.c.id))
        .order_by(edges.c.id)
    )


@cache
def waits_for() -> Select[Any]:
    """Up to ``:shown`` jobs ``:job_id`` depends on, lowest id first (the primary key)."""
    return _neighbour_list(e.job_id, e.depends_on)


@cache
def waited_on_by() -> Select[Any]:
    """Up to ``:shown`` jobs that depend on ``:job_id``, lowest id first (the depends_on index)."""
    return _neighbour_list(e.depends_on, e.job_id)


@cache
def edge_counts() -> Select[Any]:
    """How many jobs ``:job_id`` depends on, and how many depend on it, each counted up to
    ``:upto`` (from the edges' indexes alone; a chord's callback may have 100,000)."""
    job_id = bindparam("job_id", type_=BigInteger)
    upto = bindparam("upto", type_=Integer)

    def counted(where: ColumnElement[bool]) -> Any:
        some = select(literal(1)).where(where).limit(upto).subquery()
        return select(func.count()).select_from(some).scalar_subquery()

    return select(counted(e.job_id == job_id), counted(e.depends_on == job_id))


@cache
def connected_jobs() -> Select[Any]:
    """The ids of up to ``:most`` jobs joined to ``:job_id`` by edges either way, it first,
    then by distance (a breadth-first walk of the edges, each job once).

    The walk is a recursive CTE under a LIMIT: PostgreSQL computes its rows as the LIMIT asks
    for them, so a job with 100,000 dependents yields ``:most`` of them and reads no more.
    """
    start = select(bindparam("job_id", type_=BigInteger).label("id")).cte("walk", recursive=True)
    up = select(e.depends_on.label("id")).where(e.job_id == start.c.id)
    down = select(e.job_id.label("id")).where(e.depends_on == start.c.id)
    step = union_all(up, down).subquery().lateral("step")
    walk = start.union(select(step.c.id).select_from(start.join(step, true())))
    return select(walk.c.id).limit(bindparam("most", type_=Integer))


@cache
def edges_among() -> Select[Any]:
    """The edges between jobs of ``:job_ids`` (both ends in it), at most ``:edges``.

    Each job's dependencies are read from the primary key, its ``:most`` lowest ids alone,
    then kept if in the list: a callback with 100,000 dependencies costs ``:most`` rows, not
    100,000 (as :func:`connected_jobs` walks the same index in the same order, the ones it
    reached are those).
    """
    ids = id_array("job_ids")
    listed = func.unnest(ids).table_valued("id", name="listed").render_derived()
    probe = (
        select(e.job_id, e.depends_on, e.on_failure, e.pending)
        .where(e.job_id == listed.c.id)
        .order_by(e.depends_on)
        .limit(bindparam("most", type_=Integer))
        .lateral("edge")
    )
    return (
        select(probe.c.job_id, probe.c.depends_on, probe.c.on_failure, probe.c.pending)
        .select_from(listed.join(probe, true()))
        .where(probe.c.depends_on == func.any(ids))
        .order_by(probe.c.job_id, probe.c.depends_on)
        .limit(bindparam("edges", type_=Integer))
    )


@cache
def graph_nodes() -> Select[Any]:
    """The id, task, queue and status of each job of ``:job_ids`` (a primary-key probe each)."""
    return select(j.id, j.task, j.queue, j.status).where(j.id == func.any(id_array("job_ids")))


@cache
def kept_result() -> Select[Any]:
    """Job ``:job_id``'s stored result as JSON text cut to ``:max_chars``, and its whole
    length; no row for a job without one (a task that keeps none, or not succeeded yet)."""
    text = cast(j.result, Text)
    return select(
        func.left(text, bindparam("max_chars", type_=Integer)).label("text"),
        func.length(text).label("length"),
    ).where(j.id == bindparam("job_id", type_=BigInteger), j.result.is_not(None))
