"""``sa-jobqueue workflows show|cancel|retry|delete ID``: a workflow's jobs, together.

Each action is one transaction (:mod:`sa_jobqueue.ops.workflows`): it acts on all of the
workflow's jobs or, when refused, on none. An unknown workflow id, or a delete of a workflow
still running, is one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import Connection, Engine

from ..ops.filters import RequeueAttempts
from ..ops.workflows import (
    WorkflowChange,
    WorkflowInfo,
    cancel_workflow,
    delete_workflow,
    get_workflow,
    retry_workflow,
)
from ._jobs import edge_text, when
from ._operator import database_time
from ._output import table, to_json


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    database_option: Callable[[argparse.ArgumentParser], None],
) -> None:
    """Declare ``sa-jobqueue workflows`` and its actions, each on one workflow's ID."""
    workflows = commands.add_parser(
        "workflows", help="show, cancel, retry or delete a workflow's jobs, together"
    )
    actions = workflows.add_subparsers(dest="action", required=True)
    helps = {
        "show": "its jobs, their states and what each waits for",
        "cancel": "cancel its waiting and queued jobs, ask its running ones to stop",
        "retry": "bring back its dead and cancelled jobs, and what waited on them",
        "delete": "delete its jobs and their edges, once every job has ended",
    }
    for name, what in helps.items():
        sub = actions.add_parser(name, help=what)
        database_option(sub)
        sub.add_argument("workflow_id", type=int, metavar="ID", help="the workflow's id")
        sub.add_argument("--json", action="store_true", help="JSON instead of text")
        if name == "retry":
            sub.add_argument(
                "--reset-attempts",
                action="store_true",
                help="count attempts from 0 again (default: keep them and raise max_attempts)",
            )
        if name == "delete":
            sub.add_argument(
                "--force",
                action="store_true",
                help="cancel and delete its waiting and queued jobs too (never running ones)",
            )


def run(engine: Engine, args: argparse.Namespace) -> int:
    """Run ``workflows <action>``; its exit status (errors of ours propagate to the caller)."""
    if args.action == "show":
        with engine.connect() as conn:
            info = get_workflow(conn, args.workflow_id)
            now = database_time(conn)
        print(to_json(info) if args.json else workflow_text(info, now))
        return 0
    with engine.begin() as conn:
        change = _change(conn, args)
    if args.json:
        print(to_json(change))
    else:
        print(_said(args.action, change))
    return 0


def _change(conn: Connection, args: argparse.Namespace) -> WorkflowChange:
    if args.action == "cancel":
        return cancel_workflow(conn, args.workflow_id)
    if args.action == "retry":
        mode: RequeueAttempts = "reset" if args.reset_attempts else "extend"
        return retry_workflow(conn, args.workflow_id, attempts=mode)
    return delete_workflow(conn, args.workflow_id, force=args.force)


def _said(action: str, change: WorkflowChange) -> str:
    """One line of what the action did."""
    head = f"workflow {change.workflow_id}: "
    if action == "cancel":
        return head + (
            f"{change.changed} job(s) cancelled, cancellation requested of {change.requested}"
            f" running, {change.left} already finished"
        )
    if action == "retry":
        kept = f", {change.left} left as they were" if change.left else ""
        return head + (f"{change.changed} job(s) back ({change.waiting} waiting for others){kept}")
    return head + f"{change.changed} job(s) deleted"


def workflow_text(info: WorkflowInfo, now: datetime) -> str:
    """A workflow: its state and counts, then one line per job with what it waits for."""
    waits: dict[int, list[str]] = {}
    for edge in info.edges:
        waits.setdefault(edge.job_id, []).append(edge_text(edge, edge.depends_on))
    counts = ", ".join(f"{n} {status}" for status, n in info.counts.items())
    rows = [
        (
            job.id,
            job.step or "",
            job.task,
            job.status + (" (cancel requested)" if job.cancel_requested else ""),
            f"{job.attempts}/{job.max_attempts}",
            when(job, now),
            ", ".join(waits.get(job.id, [])),
        )
        for job in info.jobs
    ]
    headers = ("ID", "STEP", "TASK", "STATUS", "ATTEMPTS", "WHEN", "WAITS FOR")
    return f"workflow {info.id}: {info.state} ({counts})\n\n" + table(headers, rows)
