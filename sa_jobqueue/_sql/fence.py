"""The fence: every transition of a running attempt names the attempt it expects."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import (
    ARRAY,
    BigInteger,
    ColumnElement,
    Integer,
    Text,
    Update,
    any_,
    bindparam,
    cast,
    func,
    select,
)

from ..models import (
    RUNNING,
    jobs_table,
)
from .arrays import attempt_array, id_array

j = jobs_table.c


def fenced(stmt: Update) -> Update:
    return stmt.where(
        j.id == bindparam("job_id", type_=BigInteger),
        j.status == RUNNING,
        j.attempts == bindparam("attempt", type_=Integer),
    )


def held_ids() -> ColumnElement[bool]:
    """``id = ANY(:job_ids)``: the rows of many attempts, found through the primary key."""
    return j.id == any_(id_array("job_ids"))


def held_attempt() -> ColumnElement[int]:
    """The attempt the caller holds of the row at hand: ``:attempt_list`` at its id's place.

    ``:job_ids`` and ``:attempt_list`` become one JSON object ``{"<id>": <attempt>}``, built
    once per statement (a scalar subquery) and looked up per row by key, a binary search.
    Not a join with ``unnest(:job_ids, :attempt_list)``: the planner estimates how many rows
    are ``running`` from statistics taken while the backlog was queued (none), and with that
    estimate of one row it joined the batch by a nested loop that read the whole unnested
    array once per row, 1,000 x 1,000 comparisons for a batch of 1,000. Over a table of a
    million finished rows it chose that plan at every batch, and completing 536 jobs took
    54 ms instead of 4.
    """
    pairs = select(
        func.jsonb_object(
            cast(id_array("job_ids"), ARRAY(Text)),
            cast(attempt_array("attempt_list"), ARRAY(Text)),
        )
    ).scalar_subquery()
    return cast(pairs.op("->>")(cast(j.id, Text)), Integer)


def held_many(pairs: Iterable[tuple[int, int]]) -> dict[str, list[int]]:
    """The parameters of :func:`fenced_many` for ``(job id, attempt)`` pairs."""
    job_ids: list[int] = []
    attempts: list[int] = []
    for job_id, attempt in pairs:
        job_ids.append(job_id)
        attempts.append(attempt)
    return {"job_ids": job_ids, "attempt_list": attempts}


def fenced_many(rows: ColumnElement[bool] | None = None) -> tuple[ColumnElement[bool], ...]:
    """The fence of :func:`fenced` for many attempts at once, row by row.

    ``:job_ids`` and ``:attempt_list`` are parallel arrays (each id once). The rows are found
    by ``id = ANY(:job_ids)`` through the primary key, and no join is left for the planner to
    get wrong (see :func:`held_attempt`); or by ``rows``, a condition that finds a subset of
    them (a second ``= ANY`` on the key beside the first would make the index scan step
    through both arrays).
    """
    return (held_ids() if rows is None else rows, j.status == RUNNING, j.attempts == held_attempt())
