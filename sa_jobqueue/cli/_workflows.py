"""``sa-jobqueue workflows show|cancel|retry|delete ID``: a workflow's jobs, together.

Each action is one transaction (:mod:`sa_jobqueue.ops.workflows`): it acts on all of the
workflow's jobs or, when refused, on none. An unknown workflow id, or a delete of a workflow
still running, is one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse

from sqlalchemy import Connection, Engine

from .._sql.clock import database_now
from ..ops.filters import RequeueAttempts
from ..ops.workflows import (
    WorkflowChange,
    cancel_workflow,
    delete_workflow,
    get_workflow,
    retry_workflow,
)
from ._reports import to_json, workflow_text


def run(engine: Engine, args: argparse.Namespace) -> int:
    """Run ``workflows <action>``; its exit status (errors of ours propagate to the caller)."""
    if args.action == "show":
        with engine.connect() as conn:
            info = get_workflow(conn, args.workflow_id)
            now = conn.execute(database_now()).scalar_one()
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
