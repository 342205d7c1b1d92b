"""sa_jobqueue: job dependencies: a waiting state, the edges, and their settling.

Revision ID: sajq_0012
Revises: sajq_0011
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sa_jobqueue.migrations._locks import bound_lock_waits

revision = "sajq_0012"
down_revision = "sajq_0011"
branch_labels = None
depends_on = None

JOBS = "sa_jobqueue_jobs"
EDGES = "sa_jobqueue_dependencies"
OLD_STATUS = "status IN ('queued', 'running', 'succeeded', 'dead', 'cancelled')"

# Settles the pending edges of jobs that have just ended, given with the status each ended in,
# in the transaction (and the statement) that ended them: each edge once. A dependency that
# succeeded, or ended dead or cancelled on an edge that says 'run', satisfies its edge; one
# that ended dead or cancelled on an edge that says 'cancel' cancels the waiting job, whose own
# dependents are then settled in turn (the loop). A waiting job with no pending edge left is
# queued, due at once or at its run_at, and its queue's workers are woken at commit.
#
# The statuses are passed, not read: the calling statement's own changes may not be visible to
# this function. Each statement here takes a fresh snapshot (a VOLATILE function's do), so it
# sees edges committed while the calling statement waited for its rows.
SETTLE = """
CREATE FUNCTION sa_jobqueue_settle(p_ended bigint[], p_statuses text[])
RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    ended bigint[] := p_ended;
    statuses text[] := p_statuses;
    touched bigint[];
    cancelling bigint[];
    failed bigint[];
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
        -- Two statements settling different edges of one job at once would each see the
        -- other's edge still pending, and neither would queue it: the job's row is locked
        -- first (in id order), so the second waits, and its next statement (a fresh snapshot)
        -- sees the first's edges settled. NO KEY UPDATE: an enqueue's KEY SHARE on the job (a
        -- job that depends on it) does not hold it up.
        PERFORM 1 FROM sa_jobqueue_jobs j WHERE j.id = ANY (touched) ORDER BY j.id
            FOR NO KEY UPDATE;
        -- A failed dependency on a 'cancel' edge: the waiting job ends cancelled, and so, in
        -- the next round, do the jobs that wait for it on such edges.
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
        SELECT array_agg(id), array_agg('cancelled'::text) INTO ended, statuses FROM gone;
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

# An edge to a job that existed and had not ended when the edge was made is looked at again as
# the enqueue commits: the statement that ends that job may have run meanwhile without seeing
# the edge (not committed yet). Locking the job's row first (NO KEY UPDATE, as the statement
# that ends it does; not a lock that other enqueuers' KEY SHARE would hold up) waits for such
# a statement to commit, or makes one that comes later wait for this commit, whose edge it
# then sees.
RECHECK = """
CREATE FUNCTION sa_jobqueue_recheck_dependency()
RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    ended text;
BEGIN
    SELECT j.status INTO ended FROM sa_jobqueue_jobs j WHERE j.id = NEW.depends_on
        FOR NO KEY UPDATE;
    IF ended IN ('succeeded', 'dead', 'cancelled') THEN
        PERFORM sa_jobqueue_settle(ARRAY[NEW.depends_on], ARRAY[ended]);
    END IF;
    RETURN NULL;
END
$$
"""

REFUSE_WITH_WAITING = """
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM sa_jobqueue_jobs WHERE status = 'waiting') THEN
        RAISE EXCEPTION 'jobs are waiting for dependencies: cancel them, or let them run,'
            ' before going below revision sajq_0012';
    END IF;
END
$$
"""

ADD_STATUS_CHECK = (
    "ALTER TABLE sa_jobqueue_jobs ADD CONSTRAINT sa_jobqueue_jobs_status_check CHECK"
    " (status IN ('waiting', 'queued', 'running', 'succeeded', 'dead', 'cancelled')) NOT VALID"
)
VALIDATE_STATUS_CHECK = (
    "ALTER TABLE sa_jobqueue_jobs VALIDATE CONSTRAINT sa_jobqueue_jobs_status_check"
)

RECHECK_TRIGGER = """
CREATE CONSTRAINT TRIGGER sa_jobqueue_dependencies_recheck
AFTER INSERT ON sa_jobqueue_dependencies
DEFERRABLE INITIALLY DEFERRED
FOR EACH ROW WHEN (NEW.recheck)
EXECUTE FUNCTION sa_jobqueue_recheck_dependency()
"""


def upgrade() -> None:
    bound_lock_waits()
    # The new check is added NOT VALID and validated after: the validation reads the table
    # under a lock that lets enqueues and workers go on.
    op.drop_constraint(op.f(f"{JOBS}_status_check"), JOBS, type_="check")
    op.execute(ADD_STATUS_CHECK)
    op.execute(VALIDATE_STATUS_CHECK)
    op.create_table(
        EDGES,
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("depends_on", sa.BigInteger(), nullable=False),
        sa.Column("on_failure", sa.Text(), nullable=False),
        sa.Column("pending", sa.Boolean(), nullable=False),
        sa.Column("recheck", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.CheckConstraint(
            "on_failure IN ('cancel', 'run')", name=op.f(f"{EDGES}_on_failure_check")
        ),
        sa.CheckConstraint("job_id <> depends_on", name=op.f(f"{EDGES}_not_itself_check")),
        sa.PrimaryKeyConstraint("job_id", "depends_on", name=op.f(f"{EDGES}_pkey")),
    )
    op.create_index(f"{EDGES}_depends_on_idx", EDGES, ["depends_on"])
    # "Has this job an edge still pending?", asked as each of its dependencies ends: an index
    # of the pending edges alone keeps that one probe however many have been settled (a
    # callback after 10,000 jobs would otherwise read its settled edges again each time).
    op.create_index(f"{EDGES}_pending_idx", EDGES, ["job_id"], postgresql_where=sa.text("pending"))
    op.execute(SETTLE)
    op.execute(RECHECK)
    op.execute(RECHECK_TRIGGER)


def downgrade() -> None:
    bound_lock_waits()
    # Jobs still waiting would break the old check, and changing them would lose what they
    # wait for: refuse, and let the operator decide (run or cancel them first).
    op.execute(REFUSE_WITH_WAITING)
    op.execute("DROP TRIGGER sa_jobqueue_dependencies_recheck ON sa_jobqueue_dependencies")
    op.execute("DROP FUNCTION sa_jobqueue_recheck_dependency()")
    op.execute("DROP FUNCTION sa_jobqueue_settle(bigint[], text[])")
    op.drop_index(f"{EDGES}_pending_idx", table_name=EDGES)
    op.drop_index(f"{EDGES}_depends_on_idx", table_name=EDGES)
    op.drop_table(EDGES)
    op.drop_constraint(op.f(f"{JOBS}_status_check"), JOBS, type_="check")
    op.create_check_constraint(op.f(f"{JOBS}_status_check"), JOBS, OLD_STATUS)
