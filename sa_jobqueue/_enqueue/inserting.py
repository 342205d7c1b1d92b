"""The insert of checked jobs, on the caller's Connection: by row, from arrays, or by COPY.

One job is one INSERT, sent straight to psycopg when nothing could tell (see
:func:`sa_jobqueue._driver.first_row`); a batch of :data:`COPY_FROM` jobs or more without unique
keys goes in by COPY, a smaller or unique one by one INSERT from arrays. Jobs with unique keys
take the statements of :mod:`.unique`. Each insert sends at most one NOTIFY per queue per
transaction, riding in its own round trip (see :mod:`.wakeups`).
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from typing import Any, Final

from sqlalchemy import Connection

from .._driver import copy_possible, copy_rows, first_row
from .._sql import copying as copy_sql
from .._sql import enqueue as enqueue_sql
from .jobs import Enqueued, Membership, NewJobs, added
from .unique import insert_unique_many, insert_unique_one
from .wakeups import sent_notifications

#: The smallest batch that goes in by COPY. COPY costs two more round trips than the INSERT
#: (one to draw the ids, one more for COPY's own handshake) and saves per job: no array to
#: build and quote, no unnest, PostgreSQL's batched insert. With the server on the same
#: machine the two break even between 50 and 100 jobs (bench/enqueue_cost.py measures both
#: paths); 200 leaves room for a network's longer round trips.
COPY_FROM: Final = 200


def insert_one(conn: Connection, new: NewJobs) -> list[Enqueued]:
    """Insert ``new``'s one job in ``conn``'s transaction; wakes its queue's workers at commit.

    One round trip for a job without a unique key: the INSERT, its NOTIFY in its RETURNING.
    A list of one id, as :func:`insert_many` returns its ids.
    """
    sent = sent_notifications(conn)
    options = new.options
    params = new.params()
    params["payload"] = new.payloads[0]
    wake_up = options.queue not in sent
    if new.keys[0] is not None:
        return [insert_unique_one(conn, new, params, wake_up, sent)]
    # By position: the cache's key is then the arguments' tuple, and nothing more to build.
    traced = new.trace_context is not None
    statement = enqueue_sql.insert_job(
        options.schedule,
        wake_up,
        False,
        traced,
        options.backoff is not None,
        False,
        options.labelled,
    )
    row = first_row(conn, statement, params)
    assert row is not None  # an INSERT without ON CONFLICT returns its row or raises
    if wake_up:
        sent.add(options.queue)
    return [added(row[0])]


def insert_many(conn: Connection, new: NewJobs, member: Membership | None = None) -> list[Enqueued]:
    """Insert ``new``'s jobs, by COPY or in one INSERT (more only for unique keys); ids in order.

    The NOTIFY rides in the same round trip as the ids (the INSERT's RETURNING, or the id
    draw before a COPY), once, and only if a job was added. With ``member`` every job is
    inserted into that workflow (as that step).
    """
    if member is not None and member.callback is not None:
        new = replace(new, options=new.options.with_workflow_callback(member.callback))
    sent = sent_notifications(conn)
    wake_up = new.queue not in sent
    if not new.unique and len(new.payloads) >= COPY_FROM and copy_possible(conn):
        result = _copy_many(conn, new, wake_up, member)
        sent.add(new.queue)
        return result
    # INSERT ... SELECT may not reuse a column's name for a bind parameter, hence "b_".
    bulk = new.params("b_")
    if member is not None:
        bulk["b_workflow_id"] = member.workflow_id
        bulk["b_workflow_step"] = member.step
    period = new.options.period_seconds if new.unique else None
    if period is not None:
        bulk["b_unique_period"] = period
    statement = enqueue_sql.insert_jobs(
        new.options.schedule,
        unique=new.unique,
        traced=new.trace_context is not None,
        backoff=new.options.backoff is not None,
        wake=wake_up,
        period=period is not None,
        labels=new.options.labelled,
        workflow=member is not None,
    )
    if not new.unique:
        rows = conn.execute(statement, {**bulk, "payloads": new.payloads})
        result = [Enqueued(job_id) for job_id in rows.scalars()]
    else:
        result = insert_unique_many(conn, new, statement, bulk, sent)
    if any(job.created for job in result):
        sent.add(new.queue)  # if it was not already, the NOTIFY rode in RETURNING
    return result


def _copy_many(
    conn: Connection, new: NewJobs, wake_up: bool, member: Membership | None
) -> list[Enqueued]:
    """COPY ``new``'s jobs in (no unique keys), after one statement that draws their ids."""
    options = new.options
    schedule = options.schedule
    params: dict[str, Any] = {"n": len(new.payloads), "lease": options.lease.total_seconds()}
    if isinstance(options.run_at, timedelta):
        params["delay"] = options.run_at.total_seconds()
    if wake_up:
        params["queue"] = options.queue
    drawn = conn.execute(copy_sql.reserve_jobs(schedule, wake_up), params).one()
    # Drawn in generate_series order, so ascending; sorted in case the aggregate's order is not
    # the draw's: the jobs' ids then follow the payloads' order, as the INSERT's do.
    ids: list[int] = sorted(drawn.ids)
    tail: list[Any] = [options.queue, options.task.name, options.priority]
    tail += [options.max_attempts, drawn.lease]
    if schedule == "at":
        tail.append(options.run_at)
    elif schedule == "after":
        tail.append(drawn.visible_at)
    if new.trace_context is not None:
        tail.append(new.trace_context)
    if options.backoff is not None:
        tail.append(json.dumps(options.backoff.to_json()))
    if options.labelled:
        tail += [list(options.tags) or None, options.meta, options.on_error]
    if member is not None:
        tail += [member.workflow_id, member.step]
    statement = copy_sql.copy_jobs(
        schedule,
        traced=new.trace_context is not None,
        backoff=options.backoff is not None,
        labels=options.labelled,
        workflow=member is not None,
    )
    copy_rows(
        conn,
        statement,
        ((job_id, payload, *tail) for job_id, payload in zip(ids, new.payloads, strict=True)),
    )
    return [Enqueued(job_id) for job_id in ids]
