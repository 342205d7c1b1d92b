"""What the dashboard's pages and its JSON API read from a request alike: ids in the path,
form fields, the purge form's choice, and the reads a job's page and the purge form share;
and :class:`PageError`, the page (or answer) that cannot be given, with its status."""

from __future__ import annotations

from typing import Any, Final

from sqlalchemy import Connection
from starlette.datastructures import FormData
from starlette.requests import Request

from ..errors import InvalidJobError
from ..ops.filters import MAX_JOB_ID, RequeueAttempts, requeue_attempts
from . import _actions, _reads, _workflow_reads
from ._filters import age, finished_statuses

#: What a workflow's buttons do (``POST /workflows/{id}/{action}``), its API's too.
WORKFLOW_ACTIONS: Final = ("cancel", "retry", "delete")


class PageError(Exception):
    """A page that cannot be shown, with the HTTP status and the sentence that says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def cookie_path(request: Request) -> str:
    root: str = request.scope.get("root_path", "")
    return root or "/"


def purge_selection(statuses: list[str], age_text: str) -> dict[str, Any]:
    """What the purge form chose: finished statuses, and an age (required)."""
    if not age_text.strip():
        raise InvalidJobError("give the age: only jobs finished longer ago than it are purged")
    return {"statuses": finished_statuses(statuses), "older_than": age(age_text.strip())}


def purge_page(conn: Connection, selection: dict[str, Any] | None) -> tuple[Any, int | None]:
    """The purge form's ``now()`` and, for a selection, how many jobs it matches."""
    as_of = _reads.now(conn)
    return as_of, None if selection is None else _actions.count_purge(conn, **selection)


def job_page(
    conn: Connection, job_id: int
) -> tuple[_reads.JobDetail, _workflow_reads.JobLinks] | None:
    """A job and its result and edges, in one snapshot; None when there is no such job."""
    job = _reads.read_job(conn, job_id)
    return None if job is None else (job, _workflow_reads.read_links(conn, job_id))


def workflow_id_of(request: Request) -> int:
    """The workflow id in the path; 404 for one no bigint can hold."""
    workflow_id: int = request.path_params["workflow_id"]
    if workflow_id > MAX_JOB_ID:
        raise PageError(404, f"no workflow with id {workflow_id}")
    return workflow_id


def job_id_of(request: Request) -> int:
    """The id in the path; 404 for one no bigint can hold (there is no such job)."""
    job_id: int = request.path_params["job_id"]
    if job_id > MAX_JOB_ID:
        raise PageError(404, f"no job with id {job_id}")
    return job_id


def attempts_of(form: FormData) -> RequeueAttempts:
    """A retry form's attempts mode: its "attempts" box ticked ("reset"), or not ("extend")."""
    try:
        return requeue_attempts(field(form, "attempts") or "extend")
    except InvalidJobError as exc:
        raise PageError(400, str(exc)) from None


def field(form: FormData, name: str) -> str:
    """A form field's text ("" when missing, or when a file was sent in its place)."""
    value = form.get(name)
    return value if isinstance(value, str) else ""
