"""What the web dashboard reads that no other reader needs: reads only, each through an index.

The dashboard also runs statements of :mod:`.stats` (the live backlog), :mod:`.health` (its
findings), :mod:`.listing`, :mod:`.finished` and :mod:`.admin`. The page each statement serves
and its plan on a table of a million finished jobs are in the dashboard's how-to page.
"""

from __future__ import annotations

from datetime import datetime
from functools import cache
from typing import Any, Literal

from sqlalchemy import (
    ARRAY,
    BigInteger,
    ColumnElement,
    Integer,
    Select,
    Text,
    any_,
    bindparam,
    case,
    cast,
    column,
    extract,
    func,
    literal,
    literal_column,
    or_,
    select,
    true,
)
from sqlalchemy.dialects.postgresql import JSONB, aggregate_order_by

from ..models import (
    WAITING,
    claimable,
    dead,
    dependencies_table,
    jobs_table,
    periodic_table,
    prunable,
)
from .clock import seconds
from .listing import job_filters

j = jobs_table.c
p = periodic_table.c
e = dependencies_table.c

#: Width of one bar of the throughput chart, in seconds.
MINUTE = 60


@cache
def page_settings() -> Select[str, str]:
    """This transaction's limits: ``statement_timeout`` to ``:timeout_ms``, no parallel workers.

    Each page's statements read a bounded part of the table through an index; starting
    parallel workers for them costs more than they save (tens of milliseconds on a busy
    server against a millisecond of work), so a page asks for none.
    """
    # set_config(..., true) rather than SET LOCAL, which takes no bind parameters.
    return select(
        func.set_config(literal("statement_timeout"), bindparam("timeout_ms", type_=Text), True),
        func.set_config(literal("max_parallel_workers_per_gather"), literal("0"), True),
    )


@cache
def dead_per_queue() -> Select[str, int]:
    """Per queue: its dead jobs, however long ago they died."""
    # dead() repeats the dead index's predicate: an index-only scan of the dead rows, which
    # never touches the finished history around them.
    return select(j.queue, func.count()).where(dead()).group_by(j.queue).order_by(j.queue)


@cache
def finished_per_minute() -> Select[str, str, int, int]:
    """Per queue, finished status and minute: jobs that finished in the last ``:window`` s.

    The minute is counted back from ``now()``: 0 is the last sixty seconds, 1 the sixty before.
    """
    # Each side of the OR repeats one partial index's predicate (prune: succeeded and
    # cancelled; dead), so the planner reads the window from both indexes (a BitmapOr) and
    # never the whole history; a plain status IN (...) of the three matches neither index.
    # The width is written into the text (a constant, not a parameter): the same expression
    # appears in GROUP BY, and two parameters would be two expressions to the server.
    width = literal_column(str(MINUTE), Integer)
    minute = cast(func.floor(extract("epoch", func.now() - j.finished_at) / width), Integer)
    return (
        select(j.queue, j.status, minute.label("minute"), func.count())
        .where(or_(prunable(), dead()), j.finished_at >= func.now() - seconds("window"))
        .group_by(j.queue, j.status, minute)
        .order_by(j.queue, j.status, minute)
    )


#: The columns of a job in the list, beside the error's first characters.
LISTED: tuple[str, ...] = (
    "id",
    "queue",
    "task",
    "status",
    "priority",
    "attempts",
    "max_attempts",
    "visible_at",
    "created_at",
    "started_at",
    "finished_at",
    "cancel_requested",
)

#: Which partial index a list of jobs can read instead of the primary key's whole range.
Within = Literal["live", "dead"] | None


@cache
def id_range() -> Select[int | None, int | None]:
    """The lowest and the highest job id (NULLs for an empty table): two ends of the key."""
    return select(func.min(j.id), func.max(j.id))


@cache
def first_created_after() -> Select[int | None]:
    """The lowest id of the jobs created at or after ``now() - :older_than + :skew`` seconds,
    found by a binary search over the ids; the highest id + 1 if there is none, NULL for an
    empty table.

    A search of ids, not of times: it takes ids to grow with ``created_at``. They nearly do:
    an id is drawn when the row is inserted, ``created_at`` is the start of the inserting
    transaction, so a job can carry an earlier ``created_at`` than a lower id's by as long as
    its transaction had run when it inserted. Searching for ``:skew`` seconds past the time
    asked allows for that much; nothing allows for rows written with a ``created_at`` of
    their own making. Some 20 probes of the primary key for a million ids (one per bit of
    the range), each a descent of the index: well under a millisecond, and no index on
    ``created_at``, which every enqueue would pay for.
    """
    target = func.now() - seconds("older_than") + seconds("skew")
    # Each step keeps: rows with id < lo were created before the target, rows with id >= hi
    # at or after it. The probe is the first row at or past the middle of [lo, hi).
    start = select(
        func.min(j.id).label("lo"), (func.max(j.id) + 1).label("hi"), target.label("target")
    )
    search = start.cte("search", recursive=True)
    middle = (search.c.lo + search.c.hi) // 2
    probe = (
        select(j.id, j.created_at).where(j.id >= middle).order_by(j.id).limit(1).lateral("probe")
    )
    # None at or past the middle before hi, or one created at or after the target: the
    # boundary is at or below the middle. Otherwise it is above the probe.
    lower = or_(
        probe.c.id.is_(None), probe.c.id >= search.c.hi, probe.c.created_at >= search.c.target
    )
    step = (
        select(
            case((lower, search.c.lo), else_=probe.c.id + 1),
            case((lower, middle), else_=search.c.hi),
            search.c.target,
        )
        .select_from(search.outerjoin(probe, true()))
        .where(search.c.lo < search.c.hi)
    )
    search = search.union_all(step)
    # hi only ever comes down: its least value is where the search ended.
    return select(func.min(search.c.hi))


@cache
def job_page(
    *,
    within: Within,
    statuses: bool,
    queue: bool,
    task: bool,
    older_than: bool,
    after: bool,
    newest_first: bool,
    window: bool = False,
    payload: bool = False,
    tags: bool = False,
) -> Select[Any]:
    """Up to ``:limit`` jobs for the list, in id order: :func:`.listing.select_jobs`'s filters.

    Besides :data:`LISTED`, each row has ``error_type`` and ``error_message``: the first
    ``:preview`` characters of its last error's type and message. ``within`` adds the
    predicate of a partial index that holds every status asked for ("live": the claim index,
    for queued and running, whose rows are then read from that index alone; "dead": the dead
    index, which the planner may read and sort instead of walking the primary key).

    ``window`` bounds the ids read to ``:window_edge`` (the lowest one newest first, the
    highest oldest first): for filters no partial index serves, which would otherwise walk
    the primary key through the whole history to find a page of rare matches.

    ``payload``: only jobs whose payload contains ``:payload`` (JSON text, ``@>``). No index
    serves it (a GIN index on payloads would be paid for by every enqueue and every prune),
    so the caller reads it with ``window``: each row of the window has its payload read.
    ``tags``: only jobs carrying every one of ``:tags`` (an array), read with ``window`` the
    same way (no index on tags either: see revision ``sajq_0016``). Each row has its
    ``tags``.
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
    if payload:
        conditions.append(j.payload.op("@>")(cast(bindparam("payload", type_=Text), JSONB)))
    if window:
        edge = bindparam("window_edge", type_=BigInteger)
        conditions.append(j.id >= edge if newest_first else j.id <= edge)
    order = j.id.desc() if newest_first else j.id
    limit = bindparam("limit", type_=Integer)
    preview = bindparam("preview", type_=Integer)
    listed = select(
        *(j[c] for c in LISTED),
        func.left(j.last_error["type"].astext, preview).label("error_type"),
        func.left(j.last_error["message"].astext, preview).label("error_message"),
        j.tags,
    )
    if within == "dead":
        conditions.append(dead())
    if within != "live":
        return listed.where(*conditions).order_by(order).limit(limit)
    # Live jobs: their ids are picked from the claim index in a MATERIALIZED CTE, which the
    # planner cannot push the ORDER BY id LIMIT into. Given them, it walks the primary key
    # and filters, taking the matches to be spread evenly; live jobs sit at the newest end,
    # so oldest first that walk went through the whole history (a million rows, 400 ms) to
    # reach the first queued job. Read from the index (id is its last column), a page costs
    # the backlog's rows, never the history's. Dead jobs keep the planner's choice: spread
    # among the history, the walk finds a page of them in a few thousand rows, where their
    # index would fetch every dead row from all over the table to sort them.
    picked = select(j.id).where(claimable(), *conditions).cte("picked").prefix_with("MATERIALIZED")
    first = select(picked.c.id).order_by(picked.c.id.desc() if newest_first else picked.c.id)
    return listed.where(j.id.in_(first.limit(limit))).order_by(order)


#: The columns of a job shown in full on its page (payload and error come as text, below).
DETAILED: tuple[str, ...] = (
    *LISTED,
    "lease",
    "worker",
    "unique_key",
    "workflow_id",
    "workflow_step",
)


def _text_head(column: ColumnElement[Any], limit: ColumnElement[int]) -> ColumnElement[str]:
    return func.left(cast(column, Text), limit)


def _text_length(column: ColumnElement[Any]) -> ColumnElement[int]:
    return func.length(cast(column, Text))


@cache
def job_detail() -> Select[Any]:
    """Job ``:job_id`` for its page; no row if there is no such job.

    JSON comes as text, cut to its first ``:max_chars`` characters, with its whole length
    beside it: a megabyte payload is not sent to be shown in part, and nesting too deep for
    Python's json module (jsonb takes thousands of levels) is no error here. The last error's
    ``type``, ``message`` and ``traceback`` come apart, each cut the same way.
    """
    limit = bindparam("max_chars", type_=Integer)
    error = j.last_error
    return select(
        *(j[c] for c in DETAILED),
        _text_head(j.payload, limit).label("payload"),
        _text_length(j.payload).label("payload_length"),
        func.jsonb_typeof(error).label("error_kind"),
        _text_head(error, limit).label("error_json"),
        _text_length(error).label("error_json_length"),
        func.left(error["type"].astext, limit).label("error_type"),
        func.left(error["message"].astext, limit).label("error_message"),
        func.length(error["message"].astext).label("error_message_length"),
        func.left(error["traceback"].astext, limit).label("error_traceback"),
        func.length(error["traceback"].astext).label("error_traceback_length"),
        _text_head(j.backoff, limit).label("backoff"),
        _text_head(j.trace_context, limit).label("trace_context"),
        _attempts(limit).label("attempt_history"),
        j.tags,
        cast(j.meta, Text).label("meta"),  # whole: at most 4 KB (MAX_META_BYTES)
        j.progress,
        j.progress_message,  # whole: at most 200 characters (MAX_PROGRESS_MESSAGE)
        j.progress_at,
    ).where(j.id == bindparam("job_id", type_=BigInteger))


def _attempts(limit: ColumnElement[int]) -> ColumnElement[Any]:
    """The row's ``attempt_history`` for its page: each entry's fields apart, its error's
    message and traceback cut to ``limit`` characters with their whole lengths (20 entries
    of 22,000 characters are not sent to show a table). NULL without a history. A row
    written some other way may hold anything: what is not an array is no history, and a
    field an entry lacks (or an entry that is no object) comes back NULL."""
    history = case((func.jsonb_typeof(j.attempt_history) == "array", j.attempt_history), else_=None)
    elements = (
        func.jsonb_array_elements(history)
        .table_valued(column("entry", JSONB), with_ordinality="n")
        .render_derived(name="e")
    )
    entry = elements.c.entry
    error = entry.op("->")("error")  # not entry["error"]: subscripts need PostgreSQL 14
    fields = {
        "attempt": func.left(entry["attempt"].astext, limit),
        "at": func.left(entry["at"].astext, limit),
        "worker": func.left(entry["worker"].astext, limit),
        "duration": func.left(entry["duration"].astext, limit),
        "outcome": func.left(entry["outcome"].astext, limit),
        "error_type": func.left(error["type"].astext, limit),
        "message": func.left(error["message"].astext, limit),
        "message_length": func.length(error["message"].astext),
        "traceback": func.left(error["traceback"].astext, limit),
        "traceback_length": func.length(error["traceback"].astext),
    }
    built = func.jsonb_build_object(*(x for k, v in fields.items() for x in (literal(k), v)))
    return (
        select(func.jsonb_agg(aggregate_order_by(built, elements.c.n)))
        .select_from(elements)
        .scalar_subquery()
    )


@cache
def job_payload() -> Select[str]:
    """Job ``:job_id``'s whole payload, as JSON text; no row if there is no such job."""
    return select(cast(j.payload, Text)).where(j.id == bindparam("job_id", type_=BigInteger))


@cache
def schedules() -> Select[str, datetime]:
    """Every stored periodic schedule: ``(name, last_tick)``, by name."""
    return select(p.name, p.last_tick).order_by(p.name)


@cache
def count_finished(within: Literal["pruned", "dead"]) -> Select[int]:
    """How many jobs of ``:statuses`` finished over ``:older_than`` s ago, up to ``:upto``.

    ``within`` names the partial index that holds every one of ``:statuses`` ("pruned": the
    prune index, succeeded and cancelled; "dead": the dead index), whose predicate is
    repeated so the count reads that index's range of ``finished_at`` and stops at
    ``:upto``, however long the history.
    """
    # The order changes no count; it is the index's own order, which makes reading the index
    # the planner's cheapest way to the first :upto rows. Without it, with matches dense
    # (succeeded jobs), the table read from its start until :upto match looks cheaper, and
    # for a status that matches few of those rows it reads far more than :upto.
    some = (
        select(j.finished_at)
        .where(
            prunable() if within == "pruned" else dead(),
            j.status == any_(bindparam("statuses", type_=ARRAY(Text))),
            j.finished_at < func.now() - seconds("older_than"),
        )
        .order_by(j.finished_at)
        .limit(bindparam("upto", type_=Integer))
        .subquery("some")
    )
    return select(func.count()).select_from(some)


@cache
def count_dead(*, queue: bool, task: bool, older_than: bool) -> Select[int]:
    """How many dead jobs match the filters switched on (``:b_queue``, ``:b_task``,
    ``:b_older_than``), as :func:`.finished.requeue_dead_batch` picks them."""
    conditions = job_filters(
        statuses=False,
        queue=queue,
        task=task,
        older_than=older_than,
        after=False,
        newest_first=False,
        prefix="b_",
    )
    # dead() is a literal, which names no table: without the FROM, a count with no filter
    # (no column of the table in it) would have none.
    return select(func.count()).select_from(jobs_table).where(dead(), *conditions)


@cache
def waiting_per_queue() -> Select[str, int]:
    """Per queue: its jobs waiting for dependencies.

    No index of the jobs table holds waiting jobs; every one of them has a pending edge, and
    the pending edges have an index of their own, so the count reads those and probes the
    jobs by primary key: its cost follows the waiting jobs, not the table.
    """
    pending = select(e.job_id).where(e.pending).distinct().subquery("pending")
    return (
        select(j.queue, func.count())
        .select_from(jobs_table.join(pending, j.id == pending.c.job_id))
        .where(j.status == literal_column(f"'{WAITING}'"))
        .group_by(j.queue)
        .order_by(j.queue)
    )
