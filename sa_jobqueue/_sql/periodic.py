"""Periodic schedules: their stored ticks and the tick that moves a schedule and enqueues."""

from __future__ import annotations

from datetime import datetime
from functools import cache

from sqlalchemy import (
    ARRAY,
    DateTime,
    Insert,
    Select,
    Text,
    any_,
    bindparam,
    cast,
    column,
    func,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert

from ..models import (
    jobs_table,
    periodic_table,
)
from .enqueue import (
    CHANNEL,
    JOB_COLUMNS,
    LABEL_COLUMNS,
    job_columns,
    labels_given,
    unless_key_is_live,
)

pc = periodic_table.c

j = jobs_table.c


@cache
def last_ticks() -> Select[str, datetime]:
    """The stored ``(name, last_tick)`` of the schedules named in ``:names``."""
    return select(pc.name, pc.last_tick).where(
        pc.name == any_(bindparam("names", type_=ARRAY(Text)))
    )


@cache
def add_schedules() -> Insert:
    """Record new schedules ``:names`` with ``last_tick = :now``; existing ones are untouched.

    DO NOTHING: of several processes that see a schedule for the first time, one inserts its
    row and the others keep what it stored, so nobody's clock rewinds a schedule.
    """
    names = (
        func.unnest(bindparam("names", type_=ARRAY(Text)))
        .table_valued(column("name", Text))
        .render_derived(name="n")
    )
    rows = select(names.c.name, bindparam("now", type_=DateTime(timezone=True))).select_from(names)
    return (
        pg_insert(periodic_table)
        .from_select(["name", "last_tick"], rows)
        .on_conflict_do_nothing(index_elements=[pc.name])
    )


@cache
def enqueue_tick(unique: bool, labels: bool = False) -> Insert:
    """Move schedule ``:schedule`` forward to ``:tick`` and insert its job, in one statement.

    The move is a compare-and-set, ``last_tick < :tick``: of many processes that find the same
    tick due, the first moves the row and inserts the job; the others wait for its row lock,
    then see the new ``last_tick``, move nothing and (the INSERT reads the UPDATE's RETURNING)
    insert nothing. A process with an older tick can never move the schedule back. Being one
    statement, it is atomic even on an autocommit connection (the worker's). Returns the job's
    ``(id, pg_notify)``, or no row.

    Job parameters are those of :func:`.enqueue.insert_jobs` (``b_`` prefixed) plus ``b_payload``;
    with ``unique`` also ``b_unique_key``: a tick whose key a live job of the task holds moves
    the schedule but inserts no job, so the tick is skipped rather than queued behind it.
    With ``labels`` also ``b_tags``, ``b_meta`` and ``b_on_error``: the task's tags, meta and
    error callback.
    """
    tick = bindparam("tick", type_=DateTime(timezone=True))
    # A data-modifying CTE must sit at the top of the statement, hence add_cte() on the INSERT.
    moved = (
        update(periodic_table)
        .where(pc.name == bindparam("schedule", type_=Text), pc.last_tick < tick)
        .values(last_tick=tick)
        .returning(pc.name)
        .cte("moved")
    )
    rows = select(
        *job_columns(cast(bindparam("b_payload", type_=Text), JSONB), func.now())
    ).select_from(moved)
    names = list(JOB_COLUMNS)
    if labels:
        rows = rows.add_columns(*labels_given())
        names += LABEL_COLUMNS
    if unique:
        rows = rows.add_columns(bindparam("b_unique_key", type_=Text))
        names.append("unique_key")
    stmt = pg_insert(jobs_table).from_select(names, rows).add_cte(moved)
    if unique:
        stmt = unless_key_is_live(stmt)
    return stmt.returning(j.id, func.pg_notify(CHANNEL, j.queue))
