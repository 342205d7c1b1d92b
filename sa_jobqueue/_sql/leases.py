"""Lease renewal (the heartbeat) and the plain read that tells a lost lease from a locked row."""

from __future__ import annotations

from functools import cache

from sqlalchemy import (
    ColumnElement,
    Select,
    Update,
    any_,
    bindparam,
    case,
    cast,
    column,
    func,
    select,
    table,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.types import Double, Integer, Text

from ..models import (
    jobs_table,
)
from .arrays import pid_array
from .fence import fenced_many

j = jobs_table.c


@cache
def extend_leases() -> Update:
    """Renew the leases of many running attempts at once (the worker's heartbeat), and write
    the progress their handlers reported since the last renewal (``:progress``).

    Fenced per row like every transition: an attempt that was already reclaimed is not
    renewed, and its id is missing from the returned rows. So is one whose lease has expired
    by this statement's ``now()``, reclaimed or not: it is lost. Each returned row also says
    whether the job's cancellation has been requested. A row locked by another transaction
    is skipped rather than waited for, and is missing too: :func:`still_held` tells the two
    apart.

    What it does not do: stop a lost attempt from completing. The fence names the attempt, not
    its lease, so an attempt whose lease expired and that nobody reclaimed can still end its
    job (its worker asks its handler to stop; a handler that ends first still counts).
    """
    # Without SKIP LOCKED the heartbeat would wait for the lock of any transaction holding a
    # running job's row: the worker's own group of completed jobs that has yet to commit, or
    # an application transaction that requested a cancellation and has not committed. While
    # it waited, no lease of this worker would be renewed and no timeout enforced.
    # Only a live lease is renewed. An expired one holds no slot of its queue's cap (the
    # limited claim counts live leases only) and may have been given to another job already:
    # renewed, it would make two jobs hold one slot, and the claims that follow would go on
    # counting only the other one (the queue's recorded holders) while both run.
    # The progress to write rides in the same statement, under the same fence and lock: a
    # JSON object ``{"<id>": {"fraction": f, "message": m}}`` for the attempts whose handler
    # reported since the last write, ``{}`` when none did. Looked up per row by key, as the
    # fence's attempt is (see ``fence.held_attempt``). A row with no entry keeps what it has:
    # its SET is the row's own value, so a renewal writes what it wrote before.
    reports = cast(bindparam("progress", type_=JSONB), JSONB)
    renewable = (
        select(j.id, reports.op("->")(cast(j.id, Text)).label("report"))
        .where(*fenced_many(), _live())
        .with_for_update(of=jobs_table, skip_locked=True)
        .cte("renewable")
        .prefix_with("MATERIALIZED")
    )
    report = renewable.c.report
    reported = report.is_not(None)
    fraction = cast(report.op("->>")("fraction"), Double)
    return (
        update(jobs_table)
        .where(j.id == renewable.c.id)
        .values(
            visible_at=func.now() + j.lease,
            progress=case((reported, fraction), else_=j.progress),
            progress_message=case(
                (reported, report.op("->>")("message")), else_=j.progress_message
            ),
            progress_at=case((reported, func.now()), else_=j.progress_at),
        )
        .returning(j.id, j.cancel_requested)
    )


@cache
def end_leases() -> Update:
    """End the leases of attempts whose outcome was lost with their connection, now.

    The next claim then takes the jobs over as after an expired lease (their attempt
    counted, as for a crash), at once rather than when the leases would have run out, and
    their worker no longer holds jobs it does not run. Fenced, and live leases only: an
    attempt whose commit reached the server after all is no longer running, one already
    reclaimed names another attempt, and neither is touched. Returns the ids it ended.
    """
    return (
        update(jobs_table)
        .where(*fenced_many(), _live())
        .values(visible_at=func.now())
        .returning(j.id)
    )


@cache
def still_held() -> Select[int]:
    """Which of these attempts are still running with a live lease (a plain read: it waits
    for no lock). An attempt whose lease expired while its row was locked is lost, not busy."""
    return select(j.id).where(*fenced_many(), _live())


def _live() -> ColumnElement[bool]:
    """The row's lease has not expired by ``now()`` (a running row's ``visible_at`` is its
    lease's end)."""
    return j.visible_at > func.now()


#: The server's view of its sessions: only the two columns the heartbeat reads.
_activity = table("pg_stat_activity", column("pid", Integer), column("state", Text))


@cache
def working_backends() -> Select[int]:
    """Which of the server processes ``:pids`` are running a statement now.

    The heartbeat asks it about handlers that wait for an answer: a handler waiting on a
    backend that is not running anything (its answer was sent and lost on the way) waits on
    a silent connection. A backend waiting for a lock still counts as running.
    """
    return select(_activity.c.pid).where(
        _activity.c.pid == any_(pid_array("pids")),
        _activity.c.state == "active",
    )
