"""sa_jobqueue: a waiting job holds its unique key; no release can fail its statement.

Revision ID: sajq_0013
Revises: sajq_0012
Create Date: 2026-11-26
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op

from sa_jobqueue.migrations._locks import bound_lock_waits

revision = "sajq_0013"
down_revision = "sajq_0012"
branch_labels = None
depends_on = None

JOBS = "sa_jobqueue_jobs"
INDEX = "sa_jobqueue_jobs_unique_idx"
NEW_PREDICATE = "unique_key IS NOT NULL AND status IN ('waiting', 'queued', 'running')"
OLD_PREDICATE = "unique_key IS NOT NULL AND status IN ('queued', 'running')"
RENAME_NEW = "ALTER INDEX sa_jobqueue_jobs_unique_idx_new RENAME TO sa_jobqueue_jobs_unique_idx"
RENAME_OLD = "ALTER INDEX sa_jobqueue_jobs_unique_idx_old RENAME TO sa_jobqueue_jobs_unique_idx"

# Before this revision a waiting job held no key, so a database may hold a waiting job beside
# another live job of its task with the same key (queued, running, or waiting too). The new
# index cannot be built over such pairs. Nothing is deleted: the holder is the job that holds
# the key under the old rule (the queued or running one), or else the first enqueued (lowest
# id) of the waiting ones; each other waiting job of the key ends cancelled, with a
# UniqueConflict error naming the holder, which is what releasing it would have done from now
# on (see SETTLE). What waits for the cancelled jobs follows their edges' policy, as it does
# for any cancelled dependency.
CANCEL_DUPLICATES = """
DO $$
DECLARE
    ended bigint[];
BEGIN
    WITH duplicate AS (
        SELECT w.id, (
            SELECT h.id FROM sa_jobqueue_jobs h
            WHERE h.task = w.task AND h.unique_key = w.unique_key AND h.id <> w.id
              AND h.unique_key IS NOT NULL AND h.status IN ('waiting', 'queued', 'running')
              AND (h.status <> 'waiting' OR h.id < w.id)
            ORDER BY h.status = 'waiting', h.id
            LIMIT 1
        ) AS holder
        FROM sa_jobqueue_jobs w
        WHERE w.status = 'waiting' AND w.unique_key IS NOT NULL
    ), gone AS (
        UPDATE sa_jobqueue_jobs j
        SET status = 'cancelled', finished_at = now(), worker = NULL,
            last_error = jsonb_build_object(
                'type', 'UniqueConflict',
                'message', 'its unique key is held by job ' || d.holder
            )
        FROM duplicate d
        WHERE j.id = d.id AND d.holder IS NOT NULL
        RETURNING j.id
    )
    SELECT array_agg(id ORDER BY id) INTO ended FROM gone;
    IF ended IS NOT NULL THEN
        PERFORM sa_jobqueue_settle(ended, array_fill('cancelled'::text, ARRAY[cardinality(ended)]));
    END IF;
END
$$
"""

# sajq_0012's function, with one change in the last step (see "blocked"): a waiting job whose
# unique key another live job of its task holds is never moved to queued. With the index
# below such a pair cannot be made any more; were one there (a state this library no longer
# makes, or made by hand), queueing the job would fail the unique index, and with it the
# whole statement that is settling: a worker's batch of completions, or a claim, for every
# job it carries, again at every attempt. The job is cancelled instead, as the second enqueue
# of a held key is skipped: its own trouble ends it, and nothing else.
SETTLE = """
CREATE OR REPLACE FUNCTION sa_jobqueue_settle(p_ended bigint[], p_statuses text[])
RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    ended bigint[] := p_ended;
    statuses text[] := p_statuses;
    touched bigint[];
    cancelling bigint[];
    failed bigint[];
    blocked bigint[];
    woken text[];
    settled integer := 0;
BEGIN
    WHILE ended IS NOT NULL AND cardinality(ended) > 0 LOOP
        WITH outcome AS (
            SELECT * FROM unnest(ended, statuses) AS o (id, status)
            WHERE o.status IN ('succeeded', 'dead', 'cancelled')
        ), edges AS (
            UPDATE sa_jobqueue_dependencies e SET pending = false
            FROM outcome
            WHERE e.depends_on = outcome.id AND e.pending
            RETURNING e.job_id, e.depends_on,
                outcome.status <> 'succeeded' AND e.on_failure = 'cancel' AS cancels
        )
        SELECT array_agg(DISTINCT job_id),
               array_agg(DISTINCT job_id) FILTER (WHERE cancels),
               array_agg(depends_on) FILTER (WHERE cancels)
        INTO touched, cancelling, failed
        FROM edges;
        EXIT WHEN touched IS NULL;
        settled := settled + cardinality(touched);
        -- Locked in id order: see sajq_0012.
        PERFORM 1 FROM sa_jobqueue_jobs j WHERE j.id = ANY (touched) ORDER BY j.id
            FOR NO KEY UPDATE;
        WITH gone AS (
            UPDATE sa_jobqueue_jobs j
            SET status = 'cancelled', finished_at = now(), worker = NULL,
                last_error = jsonb_build_object(
                    'type', 'DependencyFailed',
                    'message', 'a job it depends on ended dead or cancelled: '
                        || array_to_string(failed, ', ')
                )
            WHERE j.id = ANY (cancelling) AND j.status = 'waiting'
            RETURNING j.id
        )
        SELECT array_agg(id) INTO ended FROM gone;
        -- A job ready to run whose key another live job of its task holds: the one that holds
        -- it under the index's rule, queued or running, or else a waiting one enqueued before
        -- it (two duplicates released together: the first keeps the key). The lookups repeat
        -- the unique index's predicate word for word, so each is one probe of that index
        -- (without it, PostgreSQL read the whole table for every keyed job released).
        WITH blocked AS (
            UPDATE sa_jobqueue_jobs j
            SET status = 'cancelled', finished_at = now(), worker = NULL,
                last_error = jsonb_build_object(
                    'type', 'UniqueConflict',
                    'message', 'its unique key is held by job ' || (
                        SELECT h.id FROM sa_jobqueue_jobs h
                        WHERE h.task = j.task AND h.unique_key = j.unique_key AND h.id <> j.id
                          AND h.unique_key IS NOT NULL
                          AND h.status IN ('waiting', 'queued', 'running')
                          AND (h.status <> 'waiting' OR h.id < j.id)
                        ORDER BY h.status = 'waiting', h.id
                        LIMIT 1
                    )
                )
            WHERE j.id = ANY (touched) AND j.status = 'waiting' AND j.unique_key IS NOT NULL
              AND NOT EXISTS (
                  SELECT 1 FROM sa_jobqueue_dependencies p WHERE p.job_id = j.id AND p.pending
              )
              AND EXISTS (
                  SELECT 1 FROM sa_jobqueue_jobs h
                  WHERE h.task = j.task AND h.unique_key = j.unique_key AND h.id <> j.id
                    AND h.unique_key IS NOT NULL
                    AND h.status IN ('waiting', 'queued', 'running')
                    AND (h.status <> 'waiting' OR h.id < j.id)
              )
            RETURNING j.id
        )
        SELECT array_agg(id) INTO blocked FROM blocked;
        ended := ended || blocked;
        SELECT array_fill('cancelled'::text, ARRAY[coalesce(cardinality(ended), 0)])
            INTO statuses;
        -- The rest run once nothing they wait for is pending.
        WITH ready AS (
            UPDATE sa_jobqueue_jobs j
            SET status = 'queued', visible_at = greatest(j.visible_at, now())
            WHERE j.id = ANY (touched) AND j.status = 'waiting'
              AND NOT EXISTS (
                  SELECT 1 FROM sa_jobqueue_dependencies p WHERE p.job_id = j.id AND p.pending
              )
            RETURNING j.queue
        )
        SELECT array_agg(DISTINCT queue) INTO woken FROM ready;
        PERFORM pg_notify('sa_jobqueue', q) FROM unnest(woken) AS q;
    END LOOP;
    RETURN settled;
END
$$
"""

# sajq_0012's check at the enqueue's commit, locking the dependency FOR SHARE instead of FOR
# NO KEY UPDATE. Either lock waits for a statement that is ending the dependency (it holds
# the row FOR NO KEY UPDATE) and makes one that comes later wait for this commit, which is
# all the check needs. But NO KEY UPDATE also excluded every other enqueue's check of the same
# dependency: two transactions whose edges named shared dependencies in different orders
# each held one and waited for the other's, and one of them was rolled back as a deadlock
# (251 of 800 with 8 threads naming 4 shared jobs in shuffled orders). SHARE locks do not
# exclude each other, so checks never wait for one another, whatever order they come in;
# the edges are also inserted in dependency id order, so the checks of one enqueue take
# their locks ascending, as everything else that locks jobs does.
RECHECK = """
CREATE OR REPLACE FUNCTION sa_jobqueue_recheck_dependency()
RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    ended text;
BEGIN
    SELECT j.status INTO ended FROM sa_jobqueue_jobs j WHERE j.id = NEW.depends_on
        FOR SHARE;
    IF ended IN ('succeeded', 'dead', 'cancelled') THEN
        PERFORM sa_jobqueue_settle(ARRAY[NEW.depends_on], ARRAY[ended]);
    END IF;
    RETURN NULL;
END
$$
"""


def _previous() -> ModuleType:
    """Revision sajq_0012's module: its functions, restored as they were by the downgrade."""
    path = Path(__file__).with_name("sajq_0012_dependencies.py")
    spec = importlib.util.spec_from_file_location("_sajq_0012_dependencies", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _unique_index(name: str, predicate: str) -> None:
    op.create_index(
        name, JOBS, ["task", "unique_key"], unique=True, postgresql_where=sa.text(predicate)
    )


def upgrade() -> None:
    bound_lock_waits()
    # The settling function first: the duplicates' cancellation settles their dependents
    # with it, and a dependent duplicate of its own is then handled as one.
    op.execute(SETTLE)
    op.execute(RECHECK)
    op.execute(CANCEL_DUPLICATES)
    # Built before the old index goes, under a name of its own, then renamed: enqueues'
    # ON CONFLICT always finds an index with the predicate it names. The build takes a lock
    # that holds up writes to the jobs table until this revision commits (as sajq_0004's did).
    _unique_index(f"{INDEX}_new", NEW_PREDICATE)
    op.drop_index(INDEX, table_name=JOBS)
    op.execute(RENAME_NEW)


def downgrade() -> None:
    bound_lock_waits()
    # The old index covers fewer rows: it can always be built. Jobs this revision cancelled
    # stay cancelled (their rows and errors are history).
    _unique_index(f"{INDEX}_old", OLD_PREDICATE)
    op.drop_index(INDEX, table_name=JOBS)
    op.execute(RENAME_OLD)
    previous = _previous()
    op.execute(previous.SETTLE.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
    op.execute(previous.RECHECK.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
