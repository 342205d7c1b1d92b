"""Flow control per queue: pause and resume a queue, cap how many of its jobs run at once and
how many start per period, across all workers; list the queues and what holds them back.

Each function takes a Session, scoped_session or Connection, runs in its transaction and never
commits: a pause takes effect, for every worker of the cluster, when the caller commits, and a
rollback leaves the queue as it was. A bad queue name raises InvalidNameError before any SQL.

What is not promised: a pause stops *claiming* jobs, not running ones. A job already claimed
when the pause commits still runs: one of a claim that had begun (a claim reads the pause as
its statement starts), or one buffered in a worker waiting for a free thread. A worker holds
at most its concurrency plus its prefetch (adaptive: up to 8 times its concurrency), so that,
less what it was running, is what it may start after the commit. A queue with a cap or a rate
has no buffer. Expired leases of a paused queue are not reclaimed until it resumes.

A cap (:func:`set_queue_concurrency`) bounds the queue's jobs that are running with a live
lease, counted by the database when each worker claims: every claim of a capped queue takes at
most the free slots. A job holds its slot from its claim until it leaves ``running`` (any way:
success, failure, retry, dead, cancelled, handed back) or its lease expires: the slots of a
worker that died come back when its leases expire, and the jobs are claimed again into free
slots. Lowering a cap never stops a running job; no job starts until fewer than the new cap
run. A rate limit (:func:`set_queue_rate`) bounds the jobs that start (each attempt's claim)
in each window of its period, windows counted from the Unix epoch by the database clock: at
most N in any one window (so in any period-long stretch that spans two windows, up to 2N).
Limits take effect at commit, on every worker's next claim, with no restart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from sqlalchemy import Executable

from .._binds import SessionLike, connection_of
from .._durations import value_text
from .._enqueue import wake
from .._sql import queues as queues_sql
from .._sql.stats import live_per_queue
from .._validation import check_queue_name
from ..errors import InvalidLimitError

#: The largest cap or rate count (the columns are PostgreSQL integers).
MAX_LIMIT: Final = 2**31 - 1

_RATE = re.compile(r"(\d+)\s*/\s*(\d*\.?\d*)\s*([a-z]*)")
_UNITS = {
    "ms": 0.001,
    "s": 1,
    "sec": 1,
    "second": 1,
    "m": 60,
    "min": 60,
    "minute": 60,
    "h": 3600,
    "hour": 3600,
    "d": 86400,
    "day": 86400,
}


@dataclass(frozen=True)
class RateLimit:
    """At most ``limit`` job starts per ``period``, across all workers.

    >>> RateLimit.parse("50/s")
    RateLimit(limit=50, period=datetime.timedelta(seconds=1))
    >>> str(RateLimit.parse("1000 / hour"))
    '1000/1h'
    """

    limit: int
    period: timedelta

    def __post_init__(self) -> None:
        if isinstance(self.limit, bool) or not isinstance(self.limit, int):
            raise InvalidLimitError(f"a rate's count must be an int, not {value_text(self.limit)}")
        if not 1 <= self.limit <= MAX_LIMIT:
            raise InvalidLimitError(f"a rate's count must be from 1 to {MAX_LIMIT}")
        if not isinstance(self.period, timedelta) or self.period < timedelta(milliseconds=1):
            raise InvalidLimitError(
                f"a rate's period must be 1 ms or longer, not {value_text(self.period)}"
            )

    @classmethod
    def parse(cls, text: str) -> RateLimit:
        """``N/PERIOD``: ``50/s``, ``50/second``, ``1000/h``, ``10/5m``, ``3/1.5s``."""
        match = _RATE.fullmatch(text.strip().lower())
        unit = match and _UNITS.get(
            match[3].removesuffix("s") if match[3] not in _UNITS else match[3]
        )
        if match is None or unit is None or match[2] in (".",):
            raise InvalidLimitError(f"not a rate: {text!r} (N/PERIOD, e.g. 50/s, 1000/h, 10/5m)")
        return cls(int(match[1]), timedelta(seconds=float(match[2] or 1) * unit))

    def __str__(self) -> str:
        seconds = self.period.total_seconds()
        for suffix, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
            if seconds >= size and seconds % size == 0:
                return f"{self.limit}/{int(seconds // size)}{suffix}"
        return f"{self.limit}/{seconds:g}s"


@dataclass(frozen=True)
class QueueLimits:
    """A queue's limits (None: that limit is not set): its cap, its rate, its cap per key (at
    most ``key_concurrency`` jobs of one task with the same payload ``key_field`` value running)
    and its rate per key (at most ``key_rate`` starts of one task with the same value)."""

    concurrency: int | None = None
    rate: RateLimit | None = None
    key_concurrency: int | None = None
    key_field: str | None = None
    key_rate: RateLimit | None = None

    @classmethod
    def _of(
        cls,
        cap: int | None,
        count: int | None,
        period: timedelta | None,
        key_cap: int | None,
        key_field: str | None,
        key_count: int | None,
        key_period: timedelta | None,
    ) -> QueueLimits:
        rate = None if count is None or period is None else RateLimit(count, period)
        key_rate = (
            None if key_count is None or key_period is None else RateLimit(key_count, key_period)
        )
        return cls(cap, rate, key_cap, key_field, key_rate)


@dataclass(frozen=True)
class QueueInfo:
    """One queue as :func:`list_queues` sees it: its live jobs and its flow settings."""

    queue: str
    #: Queued jobs, due or not.
    queued: int
    #: Queued jobs whose time has come.
    due: int
    running: int
    #: How long the oldest due job has been due; None if none is.
    oldest_due_age: timedelta | None
    #: When the queue was paused (database clock); None while it runs.
    paused_at: datetime | None
    #: Its cap and rate limit.
    limits: QueueLimits = QueueLimits()
    #: Jobs started in the current rate window (0 without a rate limit).
    rate_used: int = 0
    #: Running jobs whose lease has not expired: those that hold slots of a cap (a job whose
    #: worker died holds none once its lease is over).
    holding: int = 0

    @property
    def held_back_by(self) -> list[str]:
        """What stops due jobs of the queue from starting now, in words: "paused", "at cap"
        while its running jobs fill its cap, "rate limit" while its current window's starts
        are used up; empty if nothing does but the workers' free slots."""
        held = ["paused"] if self.paused_at is not None else []
        cap, rate = self.limits.concurrency, self.limits.rate
        if cap is not None and self.holding >= cap:
            held.append("at cap")
        if rate is not None and self.rate_used >= rate.limit:
            held.append("rate limit")
        return held


def pause_queue(session: SessionLike, queue: str) -> bool:
    """Pause ``queue`` in the caller's transaction: once it commits, no worker starts its jobs.

    True if this paused it, False if it was paused already (its ``paused_at`` is kept). Its
    jobs stay queued, enqueueing into it goes on, and jobs already running finish. The queue
    need not have jobs yet, or workers.
    """
    name = check_queue_name(queue)
    conn = connection_of(session)
    return conn.execute(queues_sql.pause(), {"b_queue": name}).first() is not None


def queue_known(session: SessionLike, queue: str) -> bool:
    """Whether anything knows ``queue``: it has queued, running or dead jobs, settings (a
    pause, a limit), or a registered worker serving it.

    For a warning before pausing or resuming a queue, which works on any valid name: a queue
    can be paused before its first job. Not a list of every queue ever used: a queue whose
    jobs have all succeeded and been pruned is unknown again.
    """
    name = check_queue_name(queue)
    return bool(connection_of(session).execute(queues_sql.known(), {"b_queue": name}).scalar())


def resume_queue(session: SessionLike, queue: str) -> bool:
    """Resume ``queue`` in the caller's transaction; its workers are woken when it commits.

    True if it was paused. The wake-up is the NOTIFY enqueue sends, so idle workers claim at
    once rather than at their next poll; a rollback sends nothing and leaves the queue paused.
    """
    name = check_queue_name(queue)
    conn = connection_of(session)
    if conn.execute(queues_sql.resume(), {"b_queue": name}).first() is None:
        return False
    wake(conn, name)
    return True


def check_cap(concurrency: int | None) -> int | None:
    """``concurrency`` if it is a valid cap (an int from 1 up) or None; InvalidLimitError if not."""
    if concurrency is None:
        return None
    if isinstance(concurrency, bool) or not isinstance(concurrency, int):
        raise InvalidLimitError(f"a cap must be an int, not {value_text(concurrency)}")
    if not 1 <= concurrency <= MAX_LIMIT:
        raise InvalidLimitError(
            f"a cap must be from 1 to {MAX_LIMIT}, not {concurrency} (to stop a queue, pause it)"
        )
    return concurrency


def _change(session: SessionLike, name: str, statement: Executable, **params: object) -> None:
    """Run one of the settings' upserts for queue ``name``; its workers are woken at commit,
    so a raised limit is used at once."""
    conn = connection_of(session)
    conn.execute(statement, {"b_queue": name, **params})
    wake(conn, name)


def _limits_of(session: SessionLike, name: str) -> QueueLimits:
    """``name``'s limits, its settings row locked until the caller's transaction ends."""
    row = connection_of(session).execute(queues_sql.settings(), {"b_queue": name}).first()
    return QueueLimits() if row is None else QueueLimits._of(*row)


def set_queue_concurrency(session: SessionLike, queue: str, concurrency: int | None) -> QueueLimits:
    """Cap ``queue`` at ``concurrency`` jobs running at once across all workers (None: no cap),
    in the caller's transaction; returns the queue's limits as they were.

    For example ``set_queue_concurrency(session, "emails", 3)``.

    ``concurrency`` must be an int from 1 up (:class:`~sa_jobqueue.errors.InvalidLimitError`
    before any SQL otherwise; to stop a queue, pause it). The queue need not have jobs yet, or
    workers. Its workers are woken at commit, so a raised cap is used at once.
    """
    name = check_queue_name(queue)
    cap = check_cap(concurrency)
    before = _limits_of(session, name)
    _change(session, name, queues_sql.set_concurrency(), b_concurrency=cap)
    return before


def set_queue_rate(session: SessionLike, queue: str, rate: RateLimit | str | None) -> QueueLimits:
    """Let at most ``rate`` of ``queue``'s jobs start per period across all workers (None: no
    rate limit), in the caller's transaction; returns the queue's limits as they were.

    For example ``set_queue_rate(session, "emails", "50/s")``.

    ``rate`` is a :class:`RateLimit` or its text (``"50/s"``, ``"1000/h"``, ``"10/5m"``); an
    invalid one raises :class:`~sa_jobqueue.errors.InvalidLimitError` before any SQL.
    """
    name = check_queue_name(queue)
    limit = _rate(rate)
    before = _limits_of(session, name)
    _change(
        session,
        name,
        queues_sql.set_rate(),
        b_rate_limit=None if limit is None else limit.limit,
        b_rate_period=None if limit is None else limit.period,
    )
    return before


def _rate(rate: RateLimit | str | None) -> RateLimit | None:
    """``rate`` as a RateLimit (parsed if text), or None; InvalidLimitError if it is neither."""
    limit = RateLimit.parse(rate) if isinstance(rate, str) else rate
    if limit is not None and not isinstance(limit, RateLimit):
        raise InvalidLimitError(
            f"a rate must be a RateLimit or text like '50/s', not {value_text(rate)}"
        )
    return limit


def _check_key(key: str | None) -> str:
    if not isinstance(key, str) or not 1 <= len(key) <= 200:
        raise InvalidLimitError(f"a limit per key needs the payload field of the key, not {key!r}")
    return key


def _key_field(name: str, before: QueueLimits, key: str | None, *, other: bool) -> str | None:
    """The key field a queue keeps once one of its limits per key is set to use ``key`` (None:
    removed). ``other``: the queue's other limit per key is set, and keeps its field; a queue
    has one key field, so setting a limit per key with another one is refused."""
    if key is None:
        return before.key_field if other else None
    if other and before.key_field not in (None, key):
        raise InvalidLimitError(
            f"queue {name!r} is limited per {before.key_field!r} already; its limits per key"
            " share one key field (remove the other limit per key first)"
        )
    return key


def set_queue_key_rate(
    session: SessionLike, queue: str, rate: RateLimit | str | None, *, key: str | None = None
) -> QueueLimits:
    """Let at most ``rate`` jobs of one task start per period across all workers for each value
    of the payload's top-level field ``key`` (None: no rate per key), in the caller's
    transaction; returns the queue's limits as they were.

    For example ``set_queue_key_rate(session, "api_calls", "10/s", key="customer_id")``.

    Windows and boundaries are those of :func:`set_queue_rate`, one window count per key. A
    key whose window is used up holds back only its own jobs: the others start meanwhile.
    Jobs whose payload has no such field are not limited by key. A queue has one key field,
    shared by its cap per key and its rate per key.
    """
    name = check_queue_name(queue)
    limit = _rate(rate)
    field = None if limit is None else _check_key(key)
    before = _limits_of(session, name)
    field = _key_field(name, before, field, other=before.key_concurrency is not None)
    _change(
        session,
        name,
        queues_sql.set_key_rate(),
        b_key_rate_limit=None if limit is None else limit.limit,
        b_key_rate_period=None if limit is None else limit.period,
        b_key_field=field,
    )
    return before


def set_queue_key_concurrency(
    session: SessionLike, queue: str, per_key: int | None, *, key: str | None = None
) -> QueueLimits:
    """Let at most ``per_key`` jobs of one task run at once across all workers for each value
    of the payload's top-level field ``key`` (None: no cap per key), in the caller's
    transaction; returns the queue's limits as they were.

    For example ``set_queue_key_concurrency(session, "emails", 1, key="customer_id")``.

    At 1, the jobs of a task that share a key run one at a time, in claim order (priority,
    due time, id). Not promised: that a job which goes back to the queue after an attempt (a
    failure, an expired lease) keeps its place; it is due again from then, behind its key's
    jobs already waiting. A job handed back unstarted at shutdown keeps it. Jobs whose
    payload has no such field (or not an object) are not limited by key. The value is
    compared as text (``payload ->> key``): ``42`` and ``"42"`` match.
    """
    name = check_queue_name(queue)
    cap = check_cap(per_key)
    field = None if cap is None else _check_key(key)
    before = _limits_of(session, name)
    field = _key_field(name, before, field, other=before.key_rate is not None)
    _change(
        session, name, queues_sql.set_key_concurrency(), b_key_concurrency=cap, b_key_field=field
    )
    return before


def clear_queue_limits(session: SessionLike, queue: str) -> QueueLimits:
    """Remove ``queue``'s cap, rate limit, cap per key and rate per key in the caller's
    transaction; returns them."""
    before = set_queue_concurrency(session, queue, None)
    set_queue_rate(session, queue, None)
    set_queue_key_rate(session, queue, None)
    set_queue_key_concurrency(session, queue, None)
    return before


def queue_limits(session: SessionLike) -> dict[str, QueueLimits]:
    """The queues with a limit, each with its limits."""
    return {name: found for name, (found, _) in limits_in_use(session).items()}


def paused_queues(session: SessionLike) -> dict[str, datetime]:
    """The paused queues, each with when it was paused (database clock)."""
    rows = connection_of(session).execute(queues_sql.paused_queues())
    return {name: at for name, at in rows}


def limits_in_use(session: SessionLike) -> dict[str, tuple[QueueLimits, int]]:
    """Every queue with a limit: its limits, and the starts its current rate window used."""
    rows = connection_of(session).execute(queues_sql.all_limits())
    return {
        name: (QueueLimits._of(cap, count, period, key_cap, key_field, key_count, key_period), used)
        for name, cap, count, period, used, key_cap, key_field, key_count, key_period in rows
    }


def list_queues(session: SessionLike) -> list[QueueInfo]:
    """Every queue with queued or running jobs, paused, or limited, sorted by name.

    Reads the claim index (live jobs only, never finished history) and the queues table.
    """
    conn = connection_of(session)
    live = {row[0]: row[1:] for row in conn.execute(live_per_queue())}
    paused = paused_queues(conn)
    limited = limits_in_use(conn)
    holding = {name: n for name, n in conn.execute(queues_sql.live_leases())}
    return [
        QueueInfo(
            name,
            *live.get(name, (0, 0, 0, None)),
            paused_at=paused.get(name),
            limits=limited.get(name, (QueueLimits(), 0))[0],
            rate_used=limited.get(name, (QueueLimits(), 0))[1],
            holding=holding.get(name, 0),
        )
        for name in sorted(live.keys() | paused.keys() | limited.keys())
    ]
