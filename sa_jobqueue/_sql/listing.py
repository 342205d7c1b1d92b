"""Reading jobs page by page, filtered: ``JobQueue.list_jobs`` and the test helpers."""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Boolean,
    ColumnElement,
    Integer,
    Select,
    Text,
    any_,
    bindparam,
    func,
    select,
)

from ..models import jobs_table
from .clock import seconds

j = jobs_table.c


def job_filters(
    *,
    statuses: bool,
    queue: bool,
    task: bool,
    older_than: bool,
    after: bool,
    newest_first: bool,
    prefix: str = "",
    tags: bool = False,
) -> list[ColumnElement[bool]]:
    """The conditions of :func:`select_jobs` for the filters that are switched on.

    Their parameters' names start with ``prefix``: an UPDATE of the jobs table reserves the
    columns' own names (``queue``, ``task``) for its SET clause.
    """
    conditions: list[ColumnElement[bool]] = []
    if statuses:
        conditions.append(j.status == any_(bindparam(prefix + "statuses", type_=ARRAY(Text))))
    if queue:
        conditions.append(j.queue == bindparam(prefix + "queue", type_=Text))
    if task:
        conditions.append(j.task == bindparam(prefix + "task", type_=Text))
    if older_than:
        conditions.append(j.created_at < func.now() - seconds(prefix + "older_than"))
    if tags:
        # Every tag asked for (``@>``); a job without tags has NULL there, and matches none.
        wanted = bindparam(prefix + "tags", type_=ARRAY(Text))
        conditions.append(j.tags.op("@>", return_type=Boolean)(wanted))
    if after:
        after_id = bindparam(prefix + "after_id", type_=BigInteger)
        conditions.append(j.id < after_id if newest_first else j.id > after_id)
    return conditions


@cache
def select_jobs(
    columns: tuple[str, ...],
    *,
    statuses: bool,
    queue: bool,
    task: bool,
    older_than: bool,
    after: bool,
    newest_first: bool = False,
    tags: bool = False,
) -> Select[Any]:
    """Up to ``:limit`` jobs in id order, filtered by the parameters that are switched on.

    ``:statuses`` (an array), ``:queue``, ``:task``, ``:older_than`` (seconds since
    ``created_at``), ``:tags`` (an array: jobs carrying all of them) and ``:after_id``
    (keyset pagination: the last id of the previous page).
    ``newest_first`` reverses the order, and with it the keyset: "after" is then a lower id,
    so a page never repeats or skips a row of the previous one. One statement per
    combination of filters, each with stable text.
    """
    conditions = job_filters(
        statuses=statuses,
        queue=queue,
        task=task,
        older_than=older_than,
        after=after,
        newest_first=newest_first,
        tags=tags,
    )
    return (
        select(*(j[c] for c in columns))
        .where(*conditions)
        .order_by(j.id.desc() if newest_first else j.id)  # the primary key, read either way
        .limit(bindparam("limit", type_=Integer))
    )
