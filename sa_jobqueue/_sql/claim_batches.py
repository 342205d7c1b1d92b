"""The claim that fills a batch: due jobs of one batch task (and one batch key), as the
limited claim takes them.

A batch task's batch is started by a job the worker claimed as usual (the leader); the job
thread that takes it claims the rest with ``claim_limits.claim_limited(batch=True)``,
restricted by :func:`outside_batch` to the leader's task (``:batch_task``) and, for a task with
a ``batch_key``, to jobs whose payload field ``:batch_key_field`` has the value it has in the
leader's payload (job ``:batch_leader``; a job without the field goes with leaders without it).
The value is compared as the database reads it (``payload ->> field``), so ``1`` and ``"1"``
share a batch. Through the limited claim, so
that a batch's members obey every rule the claim of their queue does: a pause, a cap (each
member holds a slot), a rate (each member is a start), limits per key, dependencies, ``run_at``
and the claim order. For a queue without a settings row the limited claim takes no lock and
its room is ``:limit``.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, ColumnElement, Text, and_, bindparam, or_, select

from ..models import jobs_table

j = jobs_table.c


def outside_batch(skip: ColumnElement[bool] | None = None) -> ColumnElement[bool]:
    """A job that does not belong in the batch being filled: of another task, or (with
    ``:batch_key_field`` given) whose payload field of that name does not have the leader's value;
    or one ``skip`` names already."""
    field = bindparam("batch_key_field", type_=Text)
    leader = jobs_table.alias("leader")
    # The leader's value read in the statement, not passed from Python: the same text the
    # candidates' ``->>`` gives, whatever JSON type the field holds.
    leaders_key = (
        select(leader.c.payload.op("->>")(field))
        .where(leader.c.id == bindparam("batch_leader", type_=BigInteger))
        .scalar_subquery()
    )
    other_key = and_(field.is_not(None), j.payload.op("->>")(field).is_distinct_from(leaders_key))
    outside = or_(j.task != bindparam("batch_task", type_=Text), other_key)
    return outside if skip is None else or_(skip, outside)
