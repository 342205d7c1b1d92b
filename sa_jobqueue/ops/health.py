"""Health checks of the queue and its database, for ``sa-jobqueue check`` and monitoring.

:func:`check` returns one :class:`Finding` per check, each ok, a warning or critical, with what
to do about it. The checks take a :class:`~sqlalchemy.Connection` and only read, in its
current transaction; their statements are in :mod:`sa_jobqueue._sql.health`.

Besides the queue's own tables it reads PostgreSQL's statistics views: ``pg_stat_user_tables``
(dead row versions, last vacuum), ``pg_stat_activity`` and ``pg_prepared_xacts`` (what holds
the xmin horizon back) and ``pg_replication_slots``. What is not promised: a role sees other
roles' sessions only as a superuser or a member of ``pg_read_all_stats``, and table statistics
lag the table by up to a few seconds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Final, Literal

from sqlalchemy import Connection

from .._sql.health import (
    due_and_stale,
    oldest_prepared,
    oldest_transaction,
    recent_dead,
    slot_horizons,
    table_vacuum,
    worker_freshness,
)
from .._sql.queues import all_limits, paused_for
from ..database import MIGRATE_HINT, check_schema
from ..errors import SchemaError
from ..models import SCHEMA_REVISION, jobs_table
from .filters import check_age
from .queues import RateLimit

Severity = Literal["ok", "warning", "critical"]
OK: Final = "ok"
WARNING: Final = "warning"
CRITICAL: Final = "critical"
SEVERITIES: Final[tuple[Severity, ...]] = ("ok", "warning", "critical")  # least severe first


# -- checks ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Thresholds:
    """When :func:`check` turns a finding from ok into a warning."""

    #: A due job waiting longer than this (in any queue).
    max_wait: timedelta = timedelta(minutes=5)
    #: A running job whose lease expired longer ago than this and is still not reclaimed.
    lease_grace: timedelta = timedelta(minutes=1)
    #: How far back dead jobs are counted ...
    dead_window: timedelta = timedelta(hours=1)
    #: ... and more than this many of them.
    max_dead: int = 0
    #: Dead row versions in the jobs table.
    max_dead_tuples: int = 100_000
    #: A transaction (or prepared transaction) holding the xmin horizon for longer than this.
    max_transaction_age: timedelta = timedelta(minutes=5)
    #: A session or replication slot holding the xmin horizon this many transactions back.
    #: A busy queue burns a few transaction ids per job, so this is minutes at 1,000 jobs/s.
    max_xmin_age: int = 1_000_000
    #: A worker whose heartbeat is older than this is not counted as live.
    stale_after: timedelta = timedelta(minutes=1)
    #: A queue paused for longer than this while it has due jobs.
    max_paused: timedelta = timedelta(hours=1)


@dataclass(frozen=True)
class Finding:
    """The outcome of one health check."""

    #: Which check: schema, workers, backlog, paused, leases, dead_jobs, vacuum,
    #: transactions, replication_slots.
    check: str
    severity: Severity
    message: str
    #: What to do about it (empty when all is well).
    action: str = ""
    #: The measured figure, for monitoring: seconds, a count, or transactions.
    value: float | None = field(default=None)


def worst(findings: Iterable[Finding]) -> Severity:
    """The most severe of the findings' severities (``ok`` for none)."""
    return max((f.severity for f in findings), key=SEVERITIES.index, default=OK)


def check(conn: Connection, thresholds: Thresholds | None = None) -> list[Finding]:
    """Check the queue's health; one :class:`Finding` per check, in a fixed order.

    Severities: ``critical`` for a schema that workers would refuse, and for due jobs with no
    live worker (jobs of paused queues aside); ``warning`` for anything over a threshold (see
    :class:`Thresholds`) and for no live worker with nothing due; ``ok`` otherwise. Reads
    only, in ``conn``'s transaction. With the schema missing or outdated, the job and worker
    checks are skipped (only the schema and the server-wide checks are reported).
    """
    t = thresholds or Thresholds()
    findings = [_check_schema(conn)]
    if findings[0].severity == OK:
        due = _read_due(conn, t)
        findings += [
            _check_workers(conn, t, due),
            _check_backlog(conn, t, due),
            _check_paused(conn, t, due),
            _check_leases(t, due),
            _check_dead(conn, t),
            _check_vacuum(conn, t),
        ]
    findings += [_check_transactions(conn, t), _check_slots(conn, t)]
    return findings


#: The most queues a finding names; the rest are counted.
NAMED_QUEUES: Final = 10


@dataclass(frozen=True)
class _Due:
    """What the checks judge of the claim index, read once (:func:`_read_due`)."""

    #: (queue, due jobs, oldest's wait) of the queues whose oldest due job waited over
    #: ``max_wait`` and that are not paused, longest waited first.
    late: list[tuple[str, int, timedelta]]
    #: Due jobs per paused queue (those with any).
    paused: dict[str, int]
    #: Due jobs in the queues that are not paused, late ones included.
    unpaused: int
    #: Running jobs past their lease by over ``lease_grace``, and the worst case.
    stale: int
    stale_for: timedelta | None


def _read_due(conn: Connection, t: Thresholds) -> _Due:
    params = {
        "max_wait": check_age(t.max_wait, "max_wait"),
        "grace": check_age(t.lease_grace, "lease_grace"),
    }
    late: list[tuple[str, int, timedelta]] = []
    paused: dict[str, int] = {}
    rest, stale, stale_for = 0, 0, None
    for queue, due, waited, is_paused, stale_n, stale_age in conn.execute(due_and_stale(), params):
        if queue is None:
            rest, stale, stale_for = int(due), int(stale_n), stale_age
        elif is_paused:
            paused[queue] = due
        else:
            late.append((queue, due, waited))
    late.sort(key=lambda row: row[2], reverse=True)
    return _Due(late, paused, rest + sum(n for _, n, _ in late), stale, stale_for)


def _check_schema(conn: Connection) -> Finding:
    try:
        check_schema(conn)
    except SchemaError as exc:
        message = str(exc)
        if message.endswith(f": {MIGRATE_HINT}"):
            return Finding(
                "schema", CRITICAL, message.removesuffix(f": {MIGRATE_HINT}"), MIGRATE_HINT
            )
        return Finding("schema", CRITICAL, message, "upgrade the sa_jobqueue package")
    return Finding("schema", OK, f"at revision {SCHEMA_REVISION}")


def _check_workers(conn: Connection, t: Thresholds, due_now: _Due) -> Finding:
    params = {"stale_after": check_age(t.stale_after, "stale_after")}
    registered, fresh = conn.execute(worker_freshness(), params).one()
    if fresh:
        return Finding("workers", OK, f"{fresh} live worker(s)", value=fresh)
    # Due jobs of a paused queue would not start with workers either: they make no emergency.
    due = due_now.unpaused
    held = sum(due_now.paused.values())
    stale = f" ({registered} registered, all stale)" if registered else ""
    also = f" (and {held} in paused queues)" if held else ""
    return Finding(
        "workers",
        CRITICAL if due else WARNING,
        f"no worker seen in the last {span(t.stale_after)}{stale}; {due} job(s) due{also}",
        "start workers (`sa-jobqueue worker module:queue`), or find out why they stopped"
        " (crashed, cannot reach the database, a lost network)",
        value=0,
    )


def _check_backlog(conn: Connection, t: Thresholds, due_now: _Due) -> Finding:
    # A paused queue's due jobs wait by design: the ``paused`` check reports them instead.
    late = due_now.late
    if not late:
        return Finding("backlog", OK, f"no due job has waited over {span(t.max_wait)}")
    worst_age = late[0][2]
    # A limited queue's due jobs may wait by design, but a backlog older than max_wait is
    # still one: its limits are named, so that raising them is seen as a remedy.
    limits = {
        name: (cap, count, period) for name, cap, count, period, *_ in conn.execute(all_limits())
    }

    def limited(q: str) -> str:
        if q not in limits:
            return ""
        cap, count, period = limits[q]
        named = [f"cap {cap}"] if cap is not None else []
        named += [f"rate {RateLimit(count, period)}"] if count is not None else []
        return ", " + ", ".join(named)

    # The longest waits first; with thousands of queues late, the message names a few.
    shown = late[:NAMED_QUEUES]
    queues = ", ".join(f"{q} ({n} due, oldest {span(age)}{limited(q)})" for q, n, age in shown)
    if len(late) > len(shown):
        queues += f" and {len(late) - len(shown)} more queue(s)"
    action = (
        "add workers or concurrency for these queues, check that some worker serves them"
        " (--queues), or look for slow jobs (`sa-jobqueue stats`)"
    )
    if any(q in limits for q, _, _ in late):
        action += "; or raise the limits of the limited ones (`sa-jobqueue queues limit`)"
    return Finding(
        "backlog",
        WARNING,
        f"due jobs waiting over {span(t.max_wait)}: {queues}",
        action,
        value=worst_age.total_seconds(),
    )


def _check_paused(conn: Connection, t: Thresholds, due_now: _Due) -> Finding:
    due = due_now.paused
    paused = list(conn.execute(paused_for()))
    long = [(q, age, due[q]) for q, age in paused if age > t.max_paused and due.get(q)]
    if not long:
        held = f" ({len(paused)} paused)" if paused else ""
        return Finding(
            "paused", OK, f"no queue with due jobs paused over {span(t.max_paused)}{held}"
        )
    queues = ", ".join(f"{q} (paused {span(age)}, {n} due)" for q, age, n in long)
    return Finding(
        "paused",
        WARNING,
        f"queues paused over {span(t.max_paused)} with due jobs: {queues}",
        "resume them when their jobs may run again (`sa-jobqueue queues resume NAME`)",
        value=max(age for _, age, _ in long).total_seconds(),
    )


def _check_leases(t: Thresholds, due_now: _Due) -> Finding:
    n, age = due_now.stale, due_now.stale_for
    if not n or age is None:
        return Finding("leases", OK, "no running job is past its lease")
    return Finding(
        "leases",
        WARNING,
        f"{n} running job(s) past their lease, the oldest by {span(age)}, not reclaimed",
        "their workers are gone or frozen and no worker is claiming from their queues:"
        " start workers for those queues (reclaiming rides on the claim)",
        value=n,
    )


def _check_dead(conn: Connection, t: Thresholds) -> Finding:
    params = {"window": check_age(t.dead_window, "dead_window")}
    n = conn.execute(recent_dead(), params).scalar_one()
    window = span(t.dead_window)
    if n <= t.max_dead:
        return Finding("dead_jobs", OK, f"{n} job(s) died in the last {window}", value=n)
    return Finding(
        "dead_jobs",
        WARNING,
        f"{n} job(s) died in the last {window}",
        "look at them (`sa-jobqueue jobs list --status dead`, `jobs show ID`); after a fix,"
        " `sa-jobqueue jobs retry`, or `jobs purge --status dead`",
        value=n,
    )


def _check_vacuum(conn: Connection, t: Thresholds) -> Finding:
    row = conn.execute(table_vacuum(), {"table": jobs_table.name}).one_or_none()
    if row is None:
        return Finding("vacuum", OK, "no statistics for the jobs table yet")
    live, dead, vacuumed, autovacuumed = row
    last = min((a for a in (vacuumed, autovacuumed) if a is not None), default=None)
    when = f"last vacuumed {span(last)} ago" if last is not None else "never vacuumed"
    message = f"{dead} dead row versions, {live} live; {when}"
    if dead <= t.max_dead_tuples:
        return Finding("vacuum", OK, message, value=dead)
    return Finding(
        "vacuum",
        WARNING,
        message,
        "see whether a transaction or replication slot holds the xmin horizon back (below);"
        " otherwise autovacuum is off or cannot keep up: VACUUM sa_jobqueue_jobs",
        value=dead,
    )


def _check_transactions(conn: Connection, t: Thresholds) -> Finding:
    candidates: list[tuple[timedelta | None, int | None, str, str]] = []
    session = conn.execute(oldest_transaction()).one_or_none()
    if session is not None:
        pid, user, app, state, age, xids = session
        who = f"pid {pid} ({user or '?'}, {app or 'no application_name'}, {state or '?'})"
        candidates.append(
            (age, xids, who, f"SELECT pg_terminate_backend({pid}), then fix what left it open")
        )
    prepared = conn.execute(oldest_prepared()).one_or_none()
    if prepared is not None:
        gid, age, xids = prepared
        action = f"COMMIT PREPARED or ROLLBACK PREPARED {gid!r}"
        candidates.append((age, xids, f"prepared transaction {gid!r}", action))
    over = [
        c
        for c in candidates
        if (c[0] is not None and c[0] > t.max_transaction_age)
        or (c[1] is not None and c[1] > t.max_xmin_age)
    ]
    oldest = max(
        (c[0] for c in candidates if c[0] is not None), default=timedelta(0)
    ).total_seconds()
    if not over:
        return Finding(
            "transactions", OK, "no transaction holds the xmin horizon for long", value=oldest
        )
    age, xids, who, action = max(over, key=lambda c: c[0] or timedelta(0))
    held = ", ".join(
        part
        for part in (
            f"open {span(age)}" if age is not None else "",
            f"{xids} transactions behind" if xids is not None else "",
        )
        if part
    )
    return Finding(
        "transactions",
        WARNING,
        f"{who} holds the xmin horizon ({held}): vacuum cannot clean the jobs table",
        action + " (idle_in_transaction_session_timeout ends sessions left idle in one)",
        value=oldest,
    )


def _check_slots(conn: Connection, t: Thresholds) -> Finding:
    behind = [
        (name, kind, active, xmin, catalog)
        for name, kind, active, xmin, catalog in conn.execute(slot_horizons())
        if max(xmin or 0, catalog or 0) > t.max_xmin_age
    ]
    if not behind:
        return Finding("replication_slots", OK, "no replication slot holds the horizon back")
    described = "; ".join(
        f"{name} ({kind}, {'active' if active else 'inactive'}"
        + (f", xmin {xmin} transactions behind" if xmin else "")
        + (f", catalog_xmin {catalog} behind (system catalogs only)" if catalog else "")
        + ")"
        for name, kind, active, xmin, catalog in behind
    )
    return Finding(
        "replication_slots",
        WARNING,
        f"replication slots hold the horizon back: {described}",
        "bring the slot's consumer or standby back, or drop a slot nobody uses:"
        " SELECT pg_drop_replication_slot('name')",
        value=max(max(x or 0, c or 0) for _, _, _, x, c in behind),
    )


def span(value: timedelta) -> str:
    """A duration for people: 0.25s, 45s, 12m03s, 3h05m, 2d04h."""
    seconds = value.total_seconds()
    if seconds < 10:
        return f"{seconds:.2g}s" if seconds < 1 else f"{seconds:.1f}s"
    total = int(seconds)
    if total < 60:
        return f"{total}s"
    minutes, secs = divmod(total, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s" if secs else f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m" if minutes else f"{hours}h"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h" if hours else f"{days}d"
