"""``sa-jobqueue jobs list|show``, and the ``jobs`` command's grammar.

``list`` pages through jobs in id order, ``show`` prints one in full (its attempts, what it
waits for, its last error's traceback); both as text for people or JSON for programs. The
actions that change jobs (``retry``, ``cancel``, ``run-now``, ``purge``) are in
:mod:`._job_changes`. A job's timing and edges are shown here as ``workflows show`` shows
them too.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from sqlalchemy import Engine

from .._visible import visible
from ..models import QUEUED, RUNNING
from ..ops.admin import Edge, JobInfo, JobSummary, get_job, job_edges, list_jobs
from ..ops.health import span
from . import _job_changes, _values
from ._exit import EXIT_ERROR
from ._operator import database_time
from ._output import table, to_json

#: Longest error message shown in a job list; ``jobs show`` prints all of it.
ERROR_WIDTH = 60


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    database_option: Callable[[argparse.ArgumentParser], None],
) -> None:
    """Declare ``sa-jobqueue jobs`` and its actions (those that change jobs come from
    :func:`._job_changes.add_parsers`)."""
    jobs = commands.add_parser("jobs", help="list, show, retry, cancel, run now or purge jobs")
    actions = jobs.add_subparsers(dest="action", required=True)

    listing = actions.add_parser(
        "list", help="jobs in id order, oldest first unless --newest-first"
    )
    database_option(listing)
    _job_changes.filter_options(listing)
    listing.add_argument("--status", type=_values.statuses, help="comma-separated statuses")
    listing.add_argument(
        "--tag",
        type=_values.tag,
        action="append",
        dest="tags",
        metavar="TAG",
        help="only jobs carrying this tag; repeat it for jobs carrying all of them",
    )
    listing.add_argument(
        "--limit", type=_values.page, default=50, help="at most this many (default 50)"
    )
    listing.add_argument("--after", type=int, metavar="ID", help="start after this id (next page)")
    listing.add_argument(
        "--newest-first",
        action="store_true",
        help="highest id first; --after then pages on to lower ids",
    )
    listing.add_argument("--json", action="store_true", help="JSON instead of a table")

    show = actions.add_parser(
        "show", help="one job in full: its attempts, its last error's traceback"
    )
    database_option(show)
    show.add_argument("job_id", type=int, metavar="ID")
    show.add_argument("--json", action="store_true", help="JSON instead of text")

    _job_changes.add_parsers(actions, database_option)


def run(engine: Engine, args: argparse.Namespace) -> int:
    """Run ``jobs <action>``; its exit status."""
    if args.action == "list":
        return _list(engine, args)
    if args.action == "show":
        return _show(engine, args)
    return _job_changes.run(engine, args)


def _list(engine: Engine, args: argparse.Namespace) -> int:
    with engine.connect() as conn:
        found = list_jobs(
            conn,
            queue=args.queue,
            task=args.task,
            status=args.status,
            older_than=args.older_than,
            limit=args.limit,
            after_id=args.after,
            newest_first=args.newest_first,
            tags=args.tags,
        )
        moment = database_time(conn)
    if args.json:
        print(to_json(found))
        return 0
    print(job_list(found, moment))
    if len(found) == args.limit:
        print(f"(more: --after {found[-1].id}{' --newest-first' if args.newest_first else ''})")
    return 0


def _show(engine: Engine, args: argparse.Namespace) -> int:
    with engine.connect() as conn:
        job = get_job(conn, args.job_id)
        waits_for, waited_by = job_edges(conn, args.job_id)
        moment = database_time(conn)
    if job is None:
        print(f"sa-jobqueue: no job with id {args.job_id}", file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        fields = {f.name: getattr(job, f.name) for f in dataclasses.fields(job)}
        print(to_json({**fields, "waits_for": waits_for, "waited_for_by": waited_by}))
    else:
        print(job_detail(job, moment, waits_for, waited_by))
    return 0


# -- rendering -------------------------------------------------------------------------------


def when(job: JobSummary, now: datetime) -> str:
    """Where the job stands in time: when it is due, its lease, or when it finished."""
    if job.status == QUEUED:
        ahead = job.visible_at - now
        return "due now" if ahead <= timedelta(0) else f"due in {span(ahead)}"
    if job.status == RUNNING:
        left = job.visible_at - now
        return f"lease {span(left)} left" if left > timedelta(0) else f"lease expired {span(-left)}"
    if job.finished_at is not None:
        return f"finished {span(now - job.finished_at)} ago"
    return ""


def _error(job: JobInfo, width: int | None = ERROR_WIDTH) -> str:
    error = job.last_error
    if not isinstance(error, dict):
        return ""
    lines = str(error.get("message", "")).splitlines()
    text = f"{error.get('type', 'Error')}: {lines[0] if lines else ''}".rstrip(": ")
    if width is not None and len(text) > width:
        text = text[: width - 1] + "…"
    return text


def job_list(jobs: Sequence[JobInfo], now: datetime) -> str:
    """One line per job: id, queue, task, status, attempts, age, timing, last error."""
    rows = [
        (
            job.id,
            job.queue,
            job.task,
            job.status + (" (cancel requested)" if job.cancel_requested else ""),
            f"{job.attempts}/{job.max_attempts}",
            span(now - job.created_at),
            when(job, now),
            _error(job),
        )
        for job in jobs
    ]
    headers = ("ID", "QUEUE", "TASK", "STATUS", "ATTEMPTS", "AGE", "WHEN", "LAST ERROR")
    return table(headers, rows) if rows else "no jobs"


def edge_text(edge: Edge, other: int) -> str:
    """``12 (pending)``, ``12 (ended)``, with ``, runs on failure`` for an edge that does."""
    state = "pending" if edge.pending else "ended"
    return f"{other} ({state}{', runs on failure' if edge.on_failure == 'run' else ''})"


def job_detail(
    job: JobInfo, now: datetime, waits_for: Sequence[Edge] = (), waited_by: Sequence[Edge] = ()
) -> str:
    """Every field of one job, the payload as JSON, what it waits for and what waits for it,
    and the error's traceback in full."""

    def moment(value: datetime | None) -> str:
        if value is None:
            return "-"
        offset = value - now
        relative = f"in {span(offset)}" if offset > timedelta(0) else f"{span(-offset)} ago"
        return f"{value.isoformat(timespec='seconds')} ({relative})"

    lines = [
        f"id:           {job.id}",
        f"queue:        {job.queue}",
        f"task:         {job.task}",
        f"status:       {job.status}"
        + (" (cancellation requested)" if job.cancel_requested else ""),
        f"priority:     {job.priority}",
        f"attempts:     {job.attempts} of {job.max_attempts}",
        f"created:      {moment(job.created_at)}",
        f"when:         {when(job, now)}",
        f"started:      {moment(job.started_at)}",
        f"finished:     {moment(job.finished_at)}",
    ]
    if job.tags:
        lines.append("tags:         " + ", ".join(job.tags))
    if job.meta is not None:
        lines.append("meta:         " + json.dumps(job.meta, ensure_ascii=False))
    if job.progress is not None:
        lines.append("progress:     " + _progress(job.progress, job.progress_message))
        lines.append(f"progress at:  {moment(job.progress_at)}")
    lines.append("payload:      " + json.dumps(job.payload, ensure_ascii=False))
    if job.result is not None:  # a task that keeps results, once the job succeeded
        lines.append("result:       " + json.dumps(job.result, ensure_ascii=False))
    if waits_for:
        lines.append("waits for:    " + ", ".join(edge_text(e, e.depends_on) for e in waits_for))
    if waited_by:
        lines.append("waited on by: " + ", ".join(edge_text(e, e.job_id) for e in waited_by))
    if isinstance(job.last_error, dict):
        lines.append(f"last error:   {_error(job, width=None)}")
    # One field a line: a line feed in a name or an error cannot start a line of its own.
    text = "\n".join(visible(line, lines=False) for line in lines)
    history = attempt_rows(job)
    if history:
        headers = ("ATTEMPT", "OUTCOME", "AT", "WORKER", "DURATION", "ERROR")
        rows = table(headers, history, right=0)
        text += "\n\nattempts (oldest first; every traceback in --json):\n"
        text += "\n".join("  " + row for row in rows.splitlines())
    traceback = job.last_error.get("traceback") if isinstance(job.last_error, dict) else None
    if traceback:
        text += "\n\n" + visible(str(traceback).rstrip())
    return text


def _progress(fraction: float, message: str | None) -> str:
    """``42% reading file 3 of 7``: the percentage rounded down, so 100% means done."""
    percent = f"{math.floor(fraction * 100)}%"
    return f"{percent} {message}" if message else percent


def _entry_error(error: object, width: int = ERROR_WIDTH) -> str:
    if not isinstance(error, dict):
        return ""
    lines = str(error.get("message", "")).splitlines()
    text = f"{error.get('type', 'Error')}: {lines[0] if lines else ''}".rstrip(": ")
    return text[: width - 1] + "…" if len(text) > width else text


def _moment(value: object) -> str:
    """An entry's ``at`` to the second, as the job's own times are shown; else as it is."""
    try:
        return datetime.fromisoformat(str(value)).isoformat(timespec="seconds")
    except ValueError:
        return str(value or "-")


def _seconds(value: object) -> str:
    return f"{value:.3f} s" if isinstance(value, int | float) else "-"


def attempt_rows(job: JobInfo) -> list[tuple[str, ...]]:
    """One row per attempt: the entries of ``attempt_history`` (whatever their shape: a row
    written by hand may hold anything), then the job's own attempt if it succeeded or runs
    (a success leaves no entry: its attempt is the row's). Empty for a job with neither."""
    entries = job.attempt_history if isinstance(job.attempt_history, list) else []
    rows: list[tuple[str, ...]] = [
        (
            str(e.get("attempt", "?")),
            str(e.get("outcome", "?")),
            _moment(e.get("at")),
            str(e.get("worker") or "-"),
            _seconds(e.get("duration")),
            _entry_error(e.get("error")),
        )
        for e in entries
        if isinstance(e, dict)
    ]
    if job.status in ("succeeded", RUNNING) and job.started_at is not None and job.attempts:
        end = job.finished_at
        took = "-" if end is None else _seconds((end - job.started_at).total_seconds())
        at = job.started_at if end is None else end
        rows.append(
            (str(job.attempts), job.status, _moment(at.isoformat()), job.worker or "-", took, "")
        )
    return rows
