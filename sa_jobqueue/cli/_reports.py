"""Text and JSON renderings of jobs, statistics and health findings, for the ``sa-jobqueue`` CLI.

Pure functions from the dataclasses of :mod:`sa_jobqueue.ops` and
:class:`~sa_jobqueue.queue.JobInfo` to strings; nothing here touches the database. Times are
shown relative to the database's ``now()``, which the caller passes in. The text layout is for
people and may change; the JSON is for programs: durations in seconds, times in ISO 8601.

Text from the rows (names, payloads, errors) is shown with its control characters written out
(:func:`~sa_jobqueue._visible.visible`): a terminal shows ``\x1b[2J``, it does not clear.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from .._visible import json_visible, visible
from ..models import FINISHED_STATUSES, QUEUED, RUNNING, STATUSES
from ..ops.admin import Edge, JobInfo, JobSummary
from ..ops.health import Finding, span, worst
from ..ops.queues import QueueInfo, QueueLimits
from ..ops.stats import Stats
from ..ops.workflows import WorkflowInfo

#: Longest error message shown in a job list; ``jobs show`` prints all of it.
ERROR_WIDTH = 60


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], right: int = 0) -> str:
    """Columns padded to their widest cell; the last ``right`` columns aligned right.

    Each cell stays on its line: its control characters, line feeds and tabs are written out.
    """
    cells = [
        [str(c) for c in headers],
        *([visible(str(c), lines=False) for c in row] for row in rows),
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    first_right = len(headers) - right
    lines = [
        "  ".join(
            cell.rjust(width) if i >= first_right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in cells
    ]
    return "\n".join(lines)


# -- JSON ------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    return value


def to_json(value: Any, indent: int | None = 2) -> str:
    """Dataclasses, lists and dicts of them as JSON (timedeltas as seconds).

    Non-ASCII text stays as it is, but for the characters a terminal would obey (DEL, C1,
    bidirectional controls, which ``json.dumps`` leaves raw): those are ``\\uNNNN`` escapes.
    """
    return json_visible(json.dumps(_plain(value), indent=indent, ensure_ascii=False))


def findings_json(findings: Sequence[Finding]) -> str:
    """The findings and the overall severity, as JSON."""
    return to_json({"status": worst(findings), "findings": list(findings)})


# -- jobs ------------------------------------------------------------------------------------


def _when(job: JobSummary, now: datetime) -> str:
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
            _when(job, now),
            _error(job),
        )
        for job in jobs
    ]
    headers = ("ID", "QUEUE", "TASK", "STATUS", "ATTEMPTS", "AGE", "WHEN", "LAST ERROR")
    return table(headers, rows) if rows else "no jobs"


def workflow_text(info: WorkflowInfo, now: datetime) -> str:
    """A workflow: its state and counts, then one line per job with what it waits for."""
    waits: dict[int, list[str]] = {}
    for edge in info.edges:
        waits.setdefault(edge.job_id, []).append(_edge(edge, edge.depends_on))
    counts = ", ".join(f"{n} {status}" for status, n in info.counts.items())
    rows = [
        (
            job.id,
            job.step or "",
            job.task,
            job.status + (" (cancel requested)" if job.cancel_requested else ""),
            f"{job.attempts}/{job.max_attempts}",
            _when(job, now),
            ", ".join(waits.get(job.id, [])),
        )
        for job in info.jobs
    ]
    headers = ("ID", "STEP", "TASK", "STATUS", "ATTEMPTS", "WHEN", "WAITS FOR")
    return f"workflow {info.id}: {info.state} ({counts})\n\n" + table(headers, rows)


def _edge(edge: Edge, other: int) -> str:
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
        f"when:         {_when(job, now)}",
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
        lines.append("waits for:    " + ", ".join(_edge(e, e.depends_on) for e in waits_for))
    if waited_by:
        lines.append("waited on by: " + ", ".join(_edge(e, e.job_id) for e in waited_by))
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


# -- stats -----------------------------------------------------------------------------------


def limits_text(limits: QueueLimits) -> str:
    """A queue's limits in words: ``at most 3 running, 50/1s``, ``no cap, no rate``, with
    ``, at most 1 per customer_id`` when it has a cap per key and ``, 10/1s per customer_id``
    when it has a rate per key."""
    cap = "no cap" if limits.concurrency is None else f"at most {limits.concurrency} running"
    text = f"{cap}, {'no rate' if limits.rate is None else limits.rate}"
    text += _per_key(limits, ", at most {} per {}")
    return text + _key_rate(limits, ", {} per {}")


def _per_key(limits: QueueLimits, form: str) -> str:
    if limits.key_concurrency is None:
        return ""
    return form.format(limits.key_concurrency, limits.key_field)


def _key_rate(limits: QueueLimits, form: str) -> str:
    if limits.key_rate is None:
        return ""
    return form.format(limits.key_rate, limits.key_field)


def _rate_cell(limits: QueueLimits, used: int) -> str:
    cell = "-" if limits.rate is None else f"{limits.rate} (used {used})"
    if limits.key_rate is None:
        return cell
    per_key = _key_rate(limits, "{} per {}")
    return per_key if limits.rate is None else f"{cell}, {per_key}"


def queue_list(queues: Sequence[QueueInfo], now: datetime) -> str:
    """One line per queue: what holds it back, its limits, its live jobs, the oldest due job's
    wait."""

    def held(q: QueueInfo) -> str:
        reasons = [
            f"paused {span(now - q.paused_at)} ago" if r == "paused" and q.paused_at else r
            for r in q.held_back_by
        ]
        return ", ".join(reasons) or "-"

    rows = [
        (
            q.queue,
            held(q),
            ("-" if q.limits.concurrency is None else str(q.limits.concurrency))
            + _per_key(q.limits, " ({} per {})"),
            _rate_cell(q.limits, q.rate_used),
            q.queued,
            q.due,
            q.running,
            span(q.oldest_due_age) if q.oldest_due_age is not None else "-",
        )
        for q in queues
    ]
    headers = ("QUEUE", "HELD BACK BY", "CAP", "RATE", "QUEUED", "DUE", "RUNNING", "OLDEST DUE")
    return (
        table(headers, rows, right=4) if rows else "no queues: no live jobs, none paused or limited"
    )


def queues_json(queues: Sequence[QueueInfo]) -> str:
    """The queues as JSON, each with its ``held_back_by`` list."""
    return to_json([{**_plain(q), "held_back_by": q.held_back_by} for q in queues])


def stats_text(stats: Stats) -> str:
    """Three tables: queues, task run times, live workers."""
    window = span(stats.window)
    queue_rows = [
        (
            q.queue + (" (paused)" if q.paused_at is not None else ""),
            *(q.counts[s] for s in STATUSES),
            q.due,
            span(q.oldest_due_age) if q.oldest_due_age is not None else "-",
            *(q.finished[s] for s in FINISHED_STATUSES),
            "-" if q.limits.concurrency is None else q.limits.concurrency,
            _rate_cell(q.limits, q.rate_used),
        )
        for q in stats.queues
    ]
    finished = tuple(f"{s.upper()}/{window}" for s in FINISHED_STATUSES)
    headers = ("QUEUE", *(s.upper() for s in STATUSES), "DUE", "OLDEST DUE", *finished)
    headers += ("CAP", "RATE")
    parts = [
        table(headers, queue_rows, right=len(headers) - 1) if queue_rows else "no jobs",
        "",
    ]
    task_rows = [(t.task, t.jobs, span(t.p50), span(t.p99)) for t in stats.tasks]
    parts += [
        table(("TASK", f"FINISHED/{window}", "P50", "P99"), task_rows, right=3)
        if task_rows
        else f"no job finished in the last {window}",
        "",
    ]
    worker_rows = [
        (
            w.name,
            w.host,
            w.pid,
            ",".join(w.queues),
            w.concurrency,
            span(stats.as_of - w.started_at),
            f"{span(stats.as_of - w.last_seen_at)} ago",
        )
        for w in stats.workers
    ]
    parts.append(
        table(("WORKER", "HOST", "PID", "QUEUES", "CONCURRENCY", "UP", "SEEN"), worker_rows)
        if worker_rows
        else "no live worker"
    )
    return "\n".join(parts)


# -- check -----------------------------------------------------------------------------------


def findings_text(findings: Sequence[Finding]) -> str:
    """One line per finding, with what to do under each that is not ok."""
    width = max((len(f.check) for f in findings), default=0)
    lines = []
    for f in findings:
        lines.append(f"{f.severity.upper():<8}  {f.check:<{width}}  {f.message}")
        if f.action:
            lines.append(f"{'':<8}  {'':<{width}}  what to do: {f.action}")
    return "\n".join(lines)
