"""The one definition of sa_jobqueue's tables: declarative models with constraints and indexes.

The Alembic revisions under ``sa_jobqueue/migrations/versions`` create exactly this; a test
compares a migrated database with :data:`metadata` and expects an empty autogenerate diff.

To let your own Alembic autogenerate see the table (and not propose to drop it), pass
``[YourBase.metadata, sa_jobqueue.models.metadata]`` as ``target_metadata``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Final, cast

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Boolean,
    CheckConstraint,
    ColumnElement,
    DateTime,
    Double,
    Identity,
    Index,
    Integer,
    Interval,
    MetaData,
    Sequence,
    SmallInteger,
    Table,
    Text,
    literal_column,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

#: The newest revision of our Alembic branch; workers refuse to run against an older one.
SCHEMA_REVISION: Final = "sajq_0019"
#: The Alembic branch label our revisions carry.
BRANCH_LABEL: Final = "sa_jobqueue"

QUEUED: Final = "queued"
RUNNING: Final = "running"
SUCCEEDED: Final = "succeeded"
DEAD: Final = "dead"
CANCELLED: Final = "cancelled"
#: Enqueued with dependencies that have not all succeeded: outside the claim index until then.
WAITING: Final = "waiting"
STATUSES: Final = (WAITING, QUEUED, RUNNING, SUCCEEDED, DEAD, CANCELLED)
FINISHED_STATUSES: Final = (SUCCEEDED, DEAD, CANCELLED)
#: Finished states that pruning deletes after the retention period; dead jobs are kept until
#: requeued or purged by hand.
PRUNED_STATUSES: Final = (SUCCEEDED, CANCELLED)
#: States in which a job's ``unique_key`` is unique (per task): from its enqueue (waiting for
#: its dependencies, or queued) until it has finished (revision sajq_0013 added ``waiting``).
#: Once it has finished, the same key may be enqueued again.
UNIQUE_STATUSES: Final = (WAITING, QUEUED, RUNNING)
#: Entries kept in a job's ``attempt_history``: the oldest goes when one more comes. The
#: default job has 5 attempts, so all of them fit; a job retried without end (a Retry that
#: polls) keeps its last 20. At the error's bounds (2,000 + 20,000 characters, see
#: ``_error_text``) that is at most about 440 KB a row, compressed in TOAST; a few KB usually.
ATTEMPT_HISTORY_LIMIT: Final = 20

metadata = MetaData(
    naming_convention={
        "ix": "%(table_name)s_%(column_0_N_name)s_idx",
        "ck": "%(table_name)s_%(constraint_name)s_check",
        "pk": "%(table_name)s_pkey",
    }
)


class Base(DeclarativeBase):
    """Declarative base for sa_jobqueue's own tables (kept apart from the application's)."""

    metadata = metadata
    # Timestamps are timezone-aware everywhere: the database clock is the only clock we trust.
    type_annotation_map = {datetime: DateTime(timezone=True)}


#: The order a queue's jobs are claimed in, by these columns of the jobs table: the lowest
#: ``priority`` first, then the earliest due (``visible_at``), then the lowest ``id`` (enqueue
#: order), which makes the order total: a claim position (``claim_after``) needs every row to
#: be before or after it. The claim index's columns after ``queue``, every claim's ORDER BY and
#: the worker's claim position are all this tuple; change it here and they change together
#: (the index through a new migration: the test comparing migrations with the models fails).
CLAIM_ORDER: Final = ("priority", "visible_at", "id")


def _status_in(statuses: tuple[str, ...]) -> str:
    return "status IN (" + ", ".join(f"'{s}'" for s in statuses) + ")"


class Job(Base):
    """A job: one row per enqueued call of a task.

    ``visible_at`` is the moment the row next becomes claimable: the scheduled time while the
    job is ``queued``, the lease expiry while it is ``running``. One column for both lets one
    partial index serve the claim of fresh jobs and the reclaim of jobs whose worker was lost.
    """

    __tablename__ = "sa_jobqueue_jobs"

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    queue: Mapped[str] = mapped_column(Text, server_default=text("'default'"))
    task: Mapped[str] = mapped_column(Text)
    payload: Mapped[Any] = mapped_column(JSONB)
    status: Mapped[str] = mapped_column(Text, server_default=text("'queued'"))
    priority: Mapped[int] = mapped_column(SmallInteger, server_default=text("0"))
    attempts: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    max_attempts: Mapped[int] = mapped_column(Integer, server_default=text("5"))
    lease: Mapped[timedelta] = mapped_column(Interval, server_default=text("'00:00:30'"))
    visible_at: Mapped[datetime] = mapped_column(server_default=text("now()"))
    created_at: Mapped[datetime] = mapped_column(server_default=text("now()"))
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    worker: Mapped[str | None] = mapped_column(Text)
    last_error: Mapped[Any | None] = mapped_column(JSONB)
    #: Set by ``JobQueue.cancel`` on a running job; its worker stops it as ``cancelled``.
    cancel_requested: Mapped[bool] = mapped_column(server_default=text("false"))
    #: At most one live (waiting, queued or running) job per task carries a given key.
    unique_key: Mapped[str | None] = mapped_column(Text)
    #: The W3C trace context of the code that enqueued the job, when tracing is on.
    trace_context: Mapped[Any | None] = mapped_column(JSONB)
    #: The job's own retry policy ({"base", "cap", "jitter"}), when enqueue overrode the task's.
    backoff: Mapped[Any | None] = mapped_column(JSONB)
    #: With a unique period: the start of the window the job was enqueued in. No other job of
    #: the task with its key may be enqueued in that window, whatever this job's status.
    unique_window: Mapped[datetime | None]
    #: What the handler returned, when its task keeps results (JSON; ``null`` for None);
    #: written by the fenced completion. NULL for tasks that keep none, and until it succeeds.
    result: Mapped[Any | None] = mapped_column(JSONB)
    #: How each attempt that did not succeed ended, oldest first, the last
    #: :data:`ATTEMPT_HISTORY_LIMIT` of them: a JSON array of objects (``attempt``, ``at``,
    #: ``worker``, ``duration`` in seconds, ``outcome``, ``error``), appended by the fenced
    #: statement that ends the attempt. NULL until one has ended so; a success adds nothing
    #: (the row itself holds its attempt, worker, start and end).
    attempt_history: Mapped[Any | None] = mapped_column(JSONB)
    #: Labels given at enqueue (the task's and the call's), for people and filters: short
    #: names, no repeats, in the order given. NULL for a job enqueued without any (the
    #: common job writes and reads nothing more). Never read by the claim; no index (see
    #: revision ``sajq_0016``): a filter on tags reads a bounded window of ids.
    tags: Mapped[list[str] | None] = mapped_column(ARRAY(Text))
    #: A JSON object given at enqueue (the task's, with the call's keys over it): what the
    #: application wants kept with the job and shown beside it. NULL when none was given.
    meta: Mapped[Any | None] = mapped_column(JSONB)
    #: The workflow the job belongs to (a chain, group, chord or DAG; see
    #: :mod:`sa_jobqueue.workflows`), drawn from :data:`workflow_ids`; NULL for a job enqueued
    #: alone. Written at the insert, never changed; the claim and the completion never read it.
    workflow_id: Mapped[int | None] = mapped_column(BigInteger)
    #: The name of the job's step in a workflow built from named steps; NULL otherwise.
    workflow_step: Mapped[str | None] = mapped_column(Text)
    #: The running attempt's latest progress report (``ctx.report_progress``): a fraction
    #: from 0 to 1, an optional message, and when the worker wrote them (database clock).
    #: Written by the heartbeat's fenced lease renewal, never by a statement of its own;
    #: cleared by the claim that starts the next attempt, kept on the finished row. NULL
    #: while nothing was reported. No CHECK constraint and no index (see revision
    #: ``sajq_0018``): the worker checks each report when it is made.
    progress: Mapped[float | None] = mapped_column(Double)
    progress_message: Mapped[str | None] = mapped_column(Text)
    progress_at: Mapped[datetime | None]
    #: The error callbacks the job's death enqueues (revision ``sajq_0019``): a JSON object
    #: with "job" (its own, one per death) and "workflow" (its workflow's, once per workflow),
    #: each the callback job to insert. NULL for a job without one, the common case. Read by
    #: ``sa_jobqueue_settle`` in the statement that ends the job, for a dead job only.
    on_error: Mapped[Any | None] = mapped_column(JSONB)

    __table_args__ = (
        CheckConstraint(_status_in(STATUSES), name="status"),
        CheckConstraint("char_length(queue) BETWEEN 1 AND 64", name="queue"),
        CheckConstraint("char_length(task) BETWEEN 1 AND 200", name="task"),
        CheckConstraint("max_attempts >= 1", name="max_attempts"),
        CheckConstraint("attempts BETWEEN 0 AND max_attempts", name="attempts"),
        CheckConstraint("lease > interval '0'", name="lease"),
        # finished_at is set exactly when the job has reached a terminal state.
        CheckConstraint(
            f"(finished_at IS NOT NULL) = ({_status_in(FINISHED_STATUSES)})", name="finished"
        ),
        # The claim index covers only claimable rows, so finished history costs the claim
        # nothing. Its column order is the claim's ORDER BY behind the queue equality.
        Index(
            "sa_jobqueue_jobs_claim_idx",
            "queue",
            *CLAIM_ORDER,
            postgresql_where=text(_status_in((QUEUED, RUNNING))),
        ),
        # Pruning finds finished rows past their retention without reading the table.
        Index(
            "sa_jobqueue_jobs_prune_idx",
            "finished_at",
            postgresql_where=text(_status_in(PRUNED_STATUSES)),
        ),
        # Dead jobs are kept until requeued or purged, among history no other index covers:
        # their counts per queue, and those that died lately, are read here, not from the table.
        Index(
            "sa_jobqueue_jobs_dead_idx",
            "queue",
            "finished_at",
            postgresql_where=text(f"status = '{DEAD}'"),
        ),
        # Unique jobs: enqueue inserts with ON CONFLICT against this index.
        Index(
            "sa_jobqueue_jobs_unique_idx",
            "task",
            "unique_key",
            unique=True,
            postgresql_where=text(f"unique_key IS NOT NULL AND {_status_in(UNIQUE_STATUSES)}"),
        ),
        # Unique periods: one job per task, key and window, finished ones included. Only jobs
        # enqueued with a period have a window, so the index holds those alone.
        Index(
            "sa_jobqueue_jobs_unique_window_idx",
            "task",
            "unique_key",
            "unique_window",
            unique=True,
            postgresql_where=text("unique_window IS NOT NULL"),
        ),
        # A workflow's jobs, read, cancelled, retried or deleted together; and a step's name
        # taken once per workflow. Jobs of no workflow are not in it, so they never write to it.
        Index(
            "sa_jobqueue_jobs_workflow_id_workflow_step_idx",
            "workflow_id",
            "workflow_step",
            unique=True,
            postgresql_where=text("workflow_id IS NOT NULL"),
        ),
        # Rows churn (claim, renewals, outcome, pruning): room on each page for a row's new
        # version, and autovacuum after 2% of the rows changed rather than 20%.
        {
            "postgresql_with": {
                "fillfactor": 70,
                "autovacuum_vacuum_scale_factor": 0.02,
                "autovacuum_vacuum_insert_scale_factor": 0.02,
                "autovacuum_analyze_scale_factor": 0.02,
            }
        },
    )


class Periodic(Base):
    """One row per periodic schedule: the last tick enqueued, so each tick runs once.

    A worker that finds a tick due moves ``last_tick`` forward with a compare-and-set and
    enqueues the job in the same transaction; of many workers, exactly one wins each tick.
    """

    __tablename__ = "sa_jobqueue_periodic"

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    last_tick: Mapped[datetime]


class WorkerRecord(Base):
    """One row per running worker process, refreshed by its heartbeat; stale rows expire."""

    __tablename__ = "sa_jobqueue_workers"

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    host: Mapped[str] = mapped_column(Text)
    pid: Mapped[int] = mapped_column(Integer)
    queues: Mapped[list[str]] = mapped_column(ARRAY(Text))
    concurrency: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(server_default=text("now()"))
    last_seen_at: Mapped[datetime] = mapped_column(server_default=text("now()"))


class QueueSettings(Base):
    """One row per queue whose flow an operator has set: paused, capped (in all or per key),
    rate-limited.

    A queue without a row runs as it always did; the claim looks its queue up here by primary
    key (one index probe) and claims nothing from a paused one, nor from one with a limit: a
    worker claims from a limited queue with the limited claim instead (``claiming``), which
    locks this row. Rows are written by :mod:`sa_jobqueue.ops` in the caller's transaction;
    resuming or removing a limit keeps the row, so the queue's other settings live beside it.
    """

    __tablename__ = "sa_jobqueue_queues"

    queue: Mapped[str] = mapped_column(Text, primary_key=True)
    #: When the queue was paused (database clock); NULL while it runs.
    paused_at: Mapped[datetime | None]
    #: At most this many of the queue's jobs run at once, across all workers; NULL: no cap.
    concurrency: Mapped[int | None] = mapped_column(Integer)
    #: At most ``rate_limit`` of the queue's jobs start in each ``rate_period`` (windows
    #: aligned to the Unix epoch, by the database clock); both NULL: no rate limit.
    rate_limit: Mapped[int | None] = mapped_column(Integer)
    rate_period: Mapped[timedelta | None] = mapped_column(Interval)
    #: The start of the rate window ``rate_count`` counts the starts of.
    rate_window: Mapped[datetime | None]
    rate_count: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    #: At most this many jobs of one task with the same key run at once, the key being the
    #: payload's top-level ``key_field`` (as text); jobs without it are not limited by key.
    key_concurrency: Mapped[int | None] = mapped_column(Integer)
    #: The key of the cap per key and of the rate per key: set while either is.
    key_field: Mapped[str | None] = mapped_column(Text)
    #: At most ``key_rate_limit`` jobs of one task with the same key start in each
    #: ``key_rate_period`` (windows aligned to the Unix epoch); both NULL: no rate per key. The
    #: starts are counted in ``sa_jobqueue_key_starts``.
    key_rate_limit: Mapped[int | None] = mapped_column(Integer)
    key_rate_period: Mapped[timedelta | None] = mapped_column(Interval)
    #: The jobs holding the cap's slots, as the last limited claim left them: each holds one
    #: while it is running with a live lease. NULL: not known (no cap until now), recounted
    #: from the jobs table.
    holders: Mapped[list[int] | None] = mapped_column(ARRAY(BigInteger))
    #: Until then (database clock) each limited claim recounts the holders from the jobs table
    #: rather than trusting ``holders``: a claim that began before the cap was set commits late.
    recount_until: Mapped[datetime | None]

    __table_args__ = (
        CheckConstraint("char_length(queue) BETWEEN 1 AND 64", name="queue"),
        CheckConstraint("concurrency >= 1", name="concurrency"),
        CheckConstraint("rate_limit >= 1", name="rate_limit"),
        CheckConstraint("rate_period >= interval '1 millisecond'", name="rate_period"),
        CheckConstraint("(rate_limit IS NULL) = (rate_period IS NULL)", name="rate"),
        CheckConstraint("rate_count >= 0", name="rate_count"),
        CheckConstraint("key_concurrency >= 1", name="key_concurrency"),
        CheckConstraint("char_length(key_field) BETWEEN 1 AND 200", name="key_field"),
        CheckConstraint(
            "(key_field IS NULL) = (key_concurrency IS NULL AND key_rate_limit IS NULL)", name="key"
        ),
        CheckConstraint("key_rate_limit >= 1", name="key_rate_limit"),
        CheckConstraint("key_rate_period >= interval '1 millisecond'", name="key_rate_period"),
        CheckConstraint("(key_rate_limit IS NULL) = (key_rate_period IS NULL)", name="key_rate"),
    )


class KeyStarts(Base):
    """The starts of one key of a queue with a rate per key, in its current window.

    One row per (queue, task, key) that has started a job, written by the limited claim that
    started it (an upsert: a new window starts the count again). Rows of windows that are over
    are deleted with the pruning of finished jobs.
    """

    __tablename__ = "sa_jobqueue_key_starts"

    queue: Mapped[str] = mapped_column(Text, primary_key=True)
    task: Mapped[str] = mapped_column(Text, primary_key=True)
    key: Mapped[str] = mapped_column(Text, primary_key=True)
    #: The start of the window ``starts`` counts in (database clock).
    window_start: Mapped[datetime]
    starts: Mapped[int] = mapped_column(Integer)


class Dependency(Base):
    """An edge of a workflow: job ``job_id`` waits for job ``depends_on`` to end.

    ``pending`` until ``depends_on`` ends (then settled, once, in the statement that ends it, or
    by the enqueue's check at its commit); a job waits (status ``waiting``) while any of its
    edges is pending. ``on_failure`` says what a dependency that ends dead or cancelled does to
    the job: ``cancel`` it (and, in turn, what waits for it), or ``run`` it as if it had
    succeeded. ``recheck``: the dependency existed and had not ended when the edge was made,
    so the enqueue looks at it again when it commits (see revision ``sajq_0012``).
    """

    __tablename__ = "sa_jobqueue_dependencies"

    # No foreign keys: every job pruned would pay their checks, whether or not any job ever had
    # a dependency. An edge outlives its jobs only once settled; pruning deletes it then.
    job_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    depends_on: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    on_failure: Mapped[str] = mapped_column(Text)
    pending: Mapped[bool]
    recheck: Mapped[bool] = mapped_column(server_default=text("false"))

    __table_args__ = (
        CheckConstraint("on_failure IN ('cancel', 'run')", name="on_failure"),
        CheckConstraint("job_id <> depends_on", name="not_itself"),
        # What ends a job looks its dependents up by the job's id.
        Index("sa_jobqueue_dependencies_depends_on_idx", "depends_on"),
        # Whether a job still has a pending edge: one probe, however many are settled.
        Index("sa_jobqueue_dependencies_pending_idx", "job_id", postgresql_where=text("pending")),
    )


class HistoryHour(Base):
    """Jobs of one queue that finished in one hour, per finished status: the long history.

    Folded in from the jobs table by the workers' upkeep (``worker/_history.py``), never by the
    completion, so finishing a job writes nothing more; the rows outlive the jobs they count,
    which pruning deletes. Kept :data:`HISTORY_KEPT` long.
    """

    __tablename__ = "sa_jobqueue_history"

    queue: Mapped[str] = mapped_column(Text, primary_key=True)
    #: The hour's start (UTC hours: the same buckets whatever a session's time zone).
    hour: Mapped[datetime] = mapped_column(primary_key=True)
    succeeded: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    dead: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    cancelled: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))


class HistoryMark(Base):
    """One row: how far the history is folded in. Jobs that finished before ``folded_to`` are
    counted in ``sa_jobqueue_history``, those since are not yet; pruning waits for the fold."""

    __tablename__ = "sa_jobqueue_history_mark"

    one: Mapped[bool] = mapped_column(primary_key=True, server_default=text("true"))
    folded_to: Mapped[datetime]

    __table_args__ = (CheckConstraint("one", name="one_row"),)


#: How long the hourly history is kept: the dashboard's week, and a day of slack.
HISTORY_KEPT: Final = timedelta(days=8)

#: Where workflow ids come from (revision sajq_0017): one per chain, group, chord or DAG.
workflow_ids: Final = Sequence("sa_jobqueue_workflow_ids", metadata=metadata)

jobs_table: Final = cast(Table, Job.__table__)
periodic_table: Final = cast(Table, Periodic.__table__)
workers_table: Final = cast(Table, WorkerRecord.__table__)
queues_table: Final = cast(Table, QueueSettings.__table__)
key_starts_table: Final = cast(Table, KeyStarts.__table__)
dependencies_table: Final = cast(Table, Dependency.__table__)
history_table: Final = cast(Table, HistoryHour.__table__)
history_mark_table: Final = cast(Table, HistoryMark.__table__)


def prunable() -> ColumnElement[bool]:
    """The prune index's predicate, as a literal so the planner can match it to the index."""
    return literal_column(_status_in(PRUNED_STATUSES), type_=Boolean)


def dead() -> ColumnElement[bool]:
    """The dead index's predicate, as a literal so the planner can match it to the index."""
    return literal_column(f"status = '{DEAD}'", type_=Boolean)


def claimable() -> ColumnElement[bool]:
    """The claim index's predicate, as a literal so the planner can match it to the index."""
    return literal_column(_status_in((QUEUED, RUNNING)), type_=Boolean)


def unique_live() -> ColumnElement[bool]:
    """The unique index's predicate, word for word: ``ON CONFLICT`` must name it to infer the
    index, and a lookup that repeats it is served by that index."""
    return literal_column(
        f"unique_key IS NOT NULL AND {_status_in(UNIQUE_STATUSES)}", type_=Boolean
    )
