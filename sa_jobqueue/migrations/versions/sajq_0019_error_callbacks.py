"""sa_jobqueue: error callbacks, a job enqueued in the statement that moves a job to dead.

Revision ID: sajq_0019
Revises: sajq_0018
Create Date: 2026-12-01
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from sa_jobqueue.migrations._locks import bound_lock_waits

revision = "sajq_0019"
down_revision = "sajq_0018"
branch_labels = None
depends_on = None

# One nullable column without a default, as sajq_0018's: the catalog changes, no row is
# rewritten, and a job without a callback stores nothing (NULL costs no bytes). ``on_error``
# is a JSON object with a key "job" (the callback of this job's own death) and a key
# "workflow" (its workflow's callback, copied onto every job of the workflow), either left
# out; each is the callback job to insert: {"task", "queue", "priority", "max_attempts",
# "lease" (seconds), "payload" (an object or null)}, resolved from the callback task's
# declaration at the enqueue, so the SQL below needs no registry of tasks.
#
# Every statement that ends jobs calls sa_jobqueue_settle in the same statement (sajq_0012),
# for every job it ended and only for those: the completion, the failure on the last attempt,
# the bury, the claim that ends a lost last attempt. So the callbacks are enqueued there: one
# place for "what a job's end sets off", every path to dead at once, fenced as the statement
# that calls it (a stale attempt's UPDATE matches no row and calls nothing), in its
# transaction. The function is split in two so the commit's recheck of a dependency
# (sa_jobqueue_recheck_dependency, which calls it for a job that ended earlier, dead perhaps)
# settles that job's dependents and enqueues no callback a second time: the old body becomes
# sa_jobqueue_settle_dependents, which the recheck now calls.
#
# The cost for jobs without a callback: one ``'dead' = ANY (p_statuses)`` test of the array
# the function is given, in PL/pgSQL, per call; a success never reads a row more. A death
# reads the dead rows again by primary key (their new version: a VOLATILE function's
# statements see what the statement calling it wrote so far).
ON_ERROR = """
CREATE OR REPLACE FUNCTION sa_jobqueue_on_error(p_ended bigint[], p_statuses text[])
RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    woken text[];
    own integer;
    flow integer;
BEGIN
    -- The job's own callback: one per death (a dead job requeued that dies again has a second
    -- death, and a second callback). Not part of any workflow.
    WITH dead AS (
        SELECT j.* FROM unnest(p_ended, p_statuses) AS o (id, status)
        JOIN sa_jobqueue_jobs j ON j.id = o.id
        WHERE o.status = 'dead' AND j.status = 'dead' AND j.on_error ? 'job'
        ORDER BY j.id
    ), made AS (
        INSERT INTO sa_jobqueue_jobs (queue, task, payload, priority, max_attempts, lease)
        SELECT d.on_error -> 'job' ->> 'queue', d.on_error -> 'job' ->> 'task',
            coalesce(nullif(d.on_error -> 'job' -> 'payload', 'null'), '{}'::jsonb)
                || jsonb_build_object('job_id', d.id, 'task', d.task, 'error', d.last_error,
                    'attempts', d.attempts, 'workflow_id', d.workflow_id),
            (d.on_error -> 'job' ->> 'priority')::smallint,
            (d.on_error -> 'job' ->> 'max_attempts')::integer,
            make_interval(secs => (d.on_error -> 'job' ->> 'lease')::double precision)
        FROM dead d
        RETURNING queue
    )
    SELECT array_agg(DISTINCT queue), count(*) INTO woken, own FROM made;
    -- The workflow's callback: once per workflow, at its first death. It joins the workflow
    -- as its step 'on_error', and the workflow's unique index on (workflow_id, workflow_step)
    -- is the guard: a second death, in this statement or a concurrent one, inserts nothing (a
    -- concurrent one waits for this transaction, and inserts if it rolls back).
    WITH dead AS (
        SELECT DISTINCT ON (j.workflow_id) j.*
        FROM unnest(p_ended, p_statuses) AS o (id, status)
        JOIN sa_jobqueue_jobs j ON j.id = o.id
        WHERE o.status = 'dead' AND j.status = 'dead' AND j.on_error ? 'workflow'
          AND j.workflow_id IS NOT NULL
        ORDER BY j.workflow_id, j.id
    ), made AS (
        INSERT INTO sa_jobqueue_jobs (queue, task, payload, priority, max_attempts, lease,
            workflow_id, workflow_step)
        SELECT d.on_error -> 'workflow' ->> 'queue', d.on_error -> 'workflow' ->> 'task',
            coalesce(nullif(d.on_error -> 'workflow' -> 'payload', 'null'), '{}'::jsonb)
                || jsonb_build_object('job_id', d.id, 'task', d.task, 'error', d.last_error,
                    'attempts', d.attempts, 'workflow_id', d.workflow_id),
            (d.on_error -> 'workflow' ->> 'priority')::smallint,
            (d.on_error -> 'workflow' ->> 'max_attempts')::integer,
            make_interval(secs => (d.on_error -> 'workflow' ->> 'lease')::double precision),
            d.workflow_id, 'on_error'
        FROM dead d
        ON CONFLICT (workflow_id, workflow_step) WHERE workflow_id IS NOT NULL DO NOTHING
        RETURNING queue
    )
    SELECT array_agg(DISTINCT queue) || woken, count(*) INTO woken, flow FROM made;
    PERFORM pg_notify('sa_jobqueue', q) FROM (SELECT DISTINCT unnest(woken) AS q) AS w;
    RETURN own + flow;
END
$$
"""

SETTLE = """
CREATE OR REPLACE FUNCTION sa_jobqueue_settle(p_ended bigint[], p_statuses text[])
RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF 'dead' = ANY (p_statuses) THEN
        PERFORM sa_jobqueue_on_error(p_ended, p_statuses);
    END IF;
    RETURN sa_jobqueue_settle_dependents(p_ended, p_statuses);
END
$$
"""


def _previous() -> ModuleType:
    """Revision sajq_0013's module: its functions, the body kept and restored."""
    path = Path(__file__).with_name("sajq_0013_waiting_unique_keys.py")
    spec = importlib.util.spec_from_file_location("_sajq_0013_waiting_unique_keys", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def upgrade() -> None:
    bound_lock_waits()
    op.add_column(
        "sa_jobqueue_jobs",
        sa.Column("on_error", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )
    previous = _previous()
    op.execute(
        previous.SETTLE.replace(
            "FUNCTION sa_jobqueue_settle(", "FUNCTION sa_jobqueue_settle_dependents(", 1
        )
    )
    op.execute(ON_ERROR)
    op.execute(SETTLE)
    op.execute(
        previous.RECHECK.replace(
            "PERFORM sa_jobqueue_settle(", "PERFORM sa_jobqueue_settle_dependents(", 1
        )
    )


def downgrade() -> None:
    bound_lock_waits()
    previous = _previous()
    op.execute(previous.SETTLE)
    op.execute(previous.RECHECK)
    op.execute("DROP FUNCTION sa_jobqueue_on_error(bigint[], text[])")
    op.execute("DROP FUNCTION sa_jobqueue_settle_dependents(bigint[], text[])")
    op.drop_column("sa_jobqueue_jobs", "on_error")
