"""What the JSON API answers: the pages' read results as plain JSON values.

Pure functions from the dataclasses the pages' readers return (:mod:`._reads`,
:mod:`._queue_reads`, :mod:`._workflow_reads`) to dicts of JSON values, so that the API and
the pages show the same reads. The conventions, for every field of every answer: moments are
ISO 8601 text with their offset (``2026-11-27T05:01:02.123456+00:00``, the database's clock),
durations are seconds (a number, the field's name ending in ``_seconds``), job ids are
integers, and a field is present, ``null`` when it has no value, whatever the row.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from ..models import FINISHED_STATUSES
from ..ops.admin import JobSummary
from ..ops.health import Finding
from ..ops.queues import QueueLimits, RateLimit
from ..ops.stats import WorkerInfo
from ._attempts import AttemptRow
from ._filters import JobFilter
from ._queue_reads import CHART_MINUTES, QueuePage, QueueRow
from ._reads import JobDetail, JobPage, ListedJob, Overview, Schedules
from ._workflow_reads import JobLinks, Neighbour, Workflow, WorkflowPage

#: A JSON value as :func:`json.dumps` takes it.
Json = Any


def moment(value: datetime | None) -> str | None:
    """``value`` as ISO 8601 text with its offset; None stays None."""
    return None if value is None else value.isoformat()


def seconds(value: timedelta | None) -> float | None:
    """``value`` in seconds; None stays None."""
    return None if value is None else value.total_seconds()


def embedded(text: str | None, length: int | None) -> tuple[Json, bool]:
    """JSON text the database cut to its first characters, as a value when it came whole:
    ``(value, True)``; ``(None, False)`` when it was cut (or is nested deeper than Python's
    json module reads), ``(None, True)`` for no text at all."""
    if text is None:
        return None, True
    if length is not None and length > len(text):
        return None, False
    try:
        return json.loads(text), True
    except (ValueError, RecursionError):
        return None, False


# -- queues, workers, health ---------------------------------------------------------------


def rate(value: RateLimit | None) -> Json:
    if value is None:
        return None
    return {"limit": value.limit, "period_seconds": seconds(value.period), "text": str(value)}


def limits(value: QueueLimits) -> Json:
    return {
        "concurrency": value.concurrency,
        "rate": rate(value.rate),
        "key_field": value.key_field,
        "key_concurrency": value.key_concurrency,
        "key_rate": rate(value.key_rate),
    }


def queue(row: QueueRow) -> Json:
    return {
        "name": row.name,
        "waiting": row.waiting,
        "queued": row.queued,
        "due": row.due,
        "running": row.running,
        "dead": row.dead,
        "oldest_due_seconds": seconds(row.oldest_due),
        # Every finished status, always: a queue with none in the hour has zeros, not {}.
        "finished_last_hour": {s: row.finished.get(s, 0) for s in FINISHED_STATUSES},
        "finished_per_minute": {
            s: row.per_minute.get(s) or [0] * CHART_MINUTES for s in FINISHED_STATUSES
        },
        "paused_at": moment(row.paused_at),
        "limits": limits(row.limits),
        "rate_used": row.rate_used,
        "holding": row.holding,
        "served": row.served,
        "held_back_by": row.held_back_by,
    }


def worker(info: WorkerInfo) -> Json:
    return {
        "name": info.name,
        "host": info.host,
        "pid": info.pid,
        "queues": list(info.queues),
        "concurrency": info.concurrency,
        "started_at": moment(info.started_at),
        "last_seen_at": moment(info.last_seen_at),
    }


def finding(found: Finding) -> Json:
    return {
        "check": found.check,
        "severity": found.severity,
        "message": found.message,
        "action": found.action,
        "value": found.value,
    }


def overview(data: Overview) -> Json:
    return {
        "as_of": moment(data.as_of),
        "queues": [queue(row) for row in data.queues],
        "total_queues": data.total_queues,
        "queues_after": data.queues_after,
        "next_queues_after": data.next_queues,
        "workers": [worker(w) for w in data.workers],
        "registered_workers": data.registered_workers,
        "findings": [finding(f) for f in data.findings],
    }


def queue_page(data: QueuePage) -> Json:
    return {
        "as_of": moment(data.as_of),
        "queue": queue(data.queue),
        "workers": [worker(w) for w in data.workers],
    }


# -- jobs ------------------------------------------------------------------------------------


def job_filter(wanted: JobFilter) -> Json:
    return {
        "queue": wanted.queue,
        "task": wanted.task,
        "statuses": list(wanted.statuses),
        "tags": list(wanted.tags),
        "older_than_seconds": seconds(wanted.older_than),
        "order": wanted.order,
        "after": wanted.after,
        "before": wanted.before,
        "limit": wanted.limit,
    }


def _summary(job: ListedJob | JobDetail | JobSummary) -> dict[str, Json]:
    return {
        "id": job.id,
        "queue": job.queue,
        "task": job.task,
        "status": job.status,
        "priority": job.priority,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "visible_at": moment(job.visible_at),
        "created_at": moment(job.created_at),
        "started_at": moment(job.started_at),
        "finished_at": moment(job.finished_at),
        "cancel_requested": job.cancel_requested,
    }


def listed_job(job: ListedJob) -> Json:
    """A row of the list: no payload; the error's type and first characters."""
    return {
        **_summary(job),
        "tags": job.tags or [],
        "error_type": job.error_type,
        "error_message": job.error_message,
    }


def job_page(page: JobPage, next_url: str | None, previous_url: str | None) -> Json:
    searched = page.searched
    return {
        "as_of": moment(page.as_of),
        "filter": job_filter(page.filter),
        "jobs": [listed_job(job) for job in page.jobs],
        "next_after": page.next_after,
        "previous_before": page.previous_before,
        "next": next_url,
        "previous": previous_url,
        "searched": None if searched is None else {"from_id": searched[0], "to_id": searched[1]},
    }


def _attempt(row: AttemptRow) -> Json:
    error = None
    if row.error_type is not None or row.message is not None or row.traceback is not None:
        error = {
            "type": row.error_type,
            "message": row.message,
            "message_length": row.message_length,
            "traceback": row.traceback,
            "traceback_length": row.traceback_length,
        }
    at = row.at.isoformat() if isinstance(row.at, datetime) else row.at
    return {
        "attempt": int(row.attempt) if row.attempt.isdigit() else None,
        "outcome": row.outcome,
        "at": at,
        "worker": row.worker,
        "duration_seconds": row.duration,
        "error": error,
    }


def _neighbour(job: Neighbour) -> Json:
    return {
        "id": job.id,
        "task": job.task,
        "status": job.status,
        "on_failure": job.on_failure,
        "pending": job.pending,
    }


def job_detail(job: JobDetail, links: JobLinks) -> Json:
    """A job in full: its values whole when they are short enough, else ``*_complete`` is
    false (the whole payload has a route of its own)."""
    payload, payload_whole = embedded(job.payload, job.payload_length)
    result, result_whole = embedded(links.result, links.result_length)
    backoff, _ = embedded(job.backoff, None)
    trace_context, _ = embedded(job.trace_context, None)
    meta, _ = embedded(job.meta, None)
    error = None
    if job.error_kind is not None:
        error = {
            "type": job.error_type,
            "message": job.error_message,
            "message_length": job.error_message_length,
            "traceback": job.error_traceback,
            "traceback_length": job.error_traceback_length,
        }
    return {
        "as_of": moment(job.as_of),
        **_summary(job),
        "lease_seconds": seconds(job.lease),
        "worker": job.worker,
        "unique_key": job.unique_key,
        "tags": job.tags or [],
        "meta": meta,
        "workflow_id": job.workflow_id,
        "workflow_step": job.workflow_step,
        "progress": job.progress,
        "progress_message": job.progress_message,
        "progress_at": moment(job.progress_at),
        "payload": payload,
        "payload_length": job.payload_length,
        "payload_complete": payload_whole,
        "last_error": error,
        "backoff": backoff,
        "trace_context": trace_context,
        "attempt_history": [_attempt(row) for row in job.attempt_rows],
        "result": result,
        "result_length": links.result_length,
        "result_complete": result_whole,
        "waits_for": [_neighbour(n) for n in links.waits_for],
        "waits_for_count": links.waits_for_count,
        "waited_on_by": [_neighbour(n) for n in links.waited_on_by],
        "waited_on_by_count": links.waited_on_by_count,
    }


def workflow(graph: Workflow) -> Json:
    return {
        "as_of": moment(graph.as_of),
        "job_id": graph.job_id,
        "nodes": [
            {
                "id": n.id,
                "task": n.task,
                "queue": n.queue,
                "status": n.status,
                "layer": n.layer,
            }
            for n in graph.nodes
        ],
        "edges": [
            {
                "job_id": e.job_id,
                "depends_on": e.depends_on,
                "on_failure": e.on_failure,
                "pending": e.pending,
            }
            for e in graph.edges
        ],
        "cut": graph.cut,
    }


def schedules(data: Schedules) -> Json:
    return {
        "as_of": moment(data.as_of),
        "declared": data.declared,
        "schedules": [
            {
                "name": row.name,
                "last_tick": moment(row.last_tick),
                "cron": None if row.schedule is None else row.schedule.cron,
                "timezone": None if row.schedule is None else row.schedule.timezone,
                "next_tick": moment(row.next_tick),
                "overdue_tick": moment(row.overdue_tick),
            }
            for row in data.rows
        ],
    }


def workflow_page(page: WorkflowPage) -> Json:
    """A workflow: its state, its counts, and its first jobs (``jobs_complete``: all of them)."""
    return {
        "as_of": moment(page.as_of),
        "id": page.id,
        "state": page.state,
        "counts": page.counts,
        "total": page.total,
        "jobs": [{**_summary(job), "step": job.step} for job in page.jobs],
        "jobs_complete": len(page.jobs) == page.total,
    }
