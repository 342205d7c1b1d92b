"""sa_jobqueue: workflows as objects: each job of one carries its id (and its step's name).

Revision ID: sajq_0017
Revises: sajq_0016
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sa_jobqueue.migrations._locks import bound_lock_waits

revision = "sajq_0017"
down_revision = "sajq_0016"
branch_labels = None
depends_on = None

JOBS = "sa_jobqueue_jobs"
INDEX = "sa_jobqueue_jobs_workflow_id_workflow_step_idx"
CREATE_SEQUENCE = "CREATE SEQUENCE IF NOT EXISTS sa_jobqueue_workflow_ids"
DROP_SEQUENCE = "DROP SEQUENCE IF EXISTS sa_jobqueue_workflow_ids"
DROP_INDEX = "DROP INDEX CONCURRENTLY IF EXISTS sa_jobqueue_jobs_workflow_id_workflow_step_idx"

# What this locks, and for how long:
#
# * The two columns are nullable and have no default: PostgreSQL changes the catalog only and
#   rewrites no row (as sajq_0011 and sajq_0014 did; measured there at a few ms on 1,000,000
#   rows). Each ALTER takes an ACCESS EXCLUSIVE lock on the jobs table, held to the first
#   commit below (the autocommit block commits the transaction before the index is built), so
#   for milliseconds once granted. Everything that touches the table queues behind an ALTER
#   that waits for its lock: set a ``lock_timeout`` in the migration's session to bound that
#   wait, and run again if it runs out (the revision is not recorded until its end, and each
#   step below can run again).
# * The sequence is a new object: no lock on the jobs table.
# * The index is built CONCURRENTLY, outside the transaction: a SHARE UPDATE EXCLUSIVE lock,
#   which lets enqueues, claims and completions go on, for as long as two scans of the table
#   take (seconds for a million rows). Existing jobs have no workflow, so the partial index
#   starts empty and nothing is backfilled. A build that fails (or is interrupted) leaves an
#   INVALID index behind: it is dropped, concurrently, before the build is tried again.


def upgrade() -> None:
    bound_lock_waits()
    op.add_column(JOBS, sa.Column("workflow_id", sa.BigInteger(), nullable=True))
    op.add_column(JOBS, sa.Column("workflow_step", sa.Text(), nullable=True))
    op.execute(CREATE_SEQUENCE)
    with op.get_context().autocommit_block():
        op.execute(DROP_INDEX)
        op.create_index(
            INDEX,
            JOBS,
            ["workflow_id", "workflow_step"],
            unique=True,
            postgresql_where=sa.text("workflow_id IS NOT NULL"),
            postgresql_concurrently=True,
        )


def downgrade() -> None:
    bound_lock_waits()
    # Jobs keep running as plain jobs with their dependency edges; only the workflow ids go.
    with op.get_context().autocommit_block():
        op.execute(DROP_INDEX)
    op.drop_column(JOBS, "workflow_step")
    op.drop_column(JOBS, "workflow_id")
    op.execute(DROP_SEQUENCE)
