"""sa_jobqueue: tags and meta, the labels and the JSON object an enqueue keeps with its job.

Revision ID: sajq_0016
Revises: sajq_0015
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "sajq_0016"
down_revision = "sajq_0015"
branch_labels = None
depends_on = None

# Two nullable columns without defaults, as sajq_0014's ``attempt_history``: PostgreSQL 11+
# changes the catalog only and rewrites no row (NULL costs no bytes in the rows of jobs
# enqueued without tags or meta, and their enqueues send the statements they sent before).
# Each ALTER takes an ACCESS EXCLUSIVE lock on the jobs table, held to the migration's
# commit: measured on PostgreSQL 15 with 1,000,000 rows, both ALTERs together took
# milliseconds and the table's file stayed the same size (no rewrite). The lock must first
# be granted, though, and everything that touches the table queues behind the ALTER while it
# waits: a long transaction holding any lock on the jobs table holds up the workers' claims
# and completions until it ends. Set a ``lock_timeout`` in the migration's session to bound
# that wait, and retry if it runs out.
#
# No index: the claim and the completion never read these columns, and a GIN index on tags
# would be written by every enqueue (and cleaned by every prune) to serve an operator's
# filter. bench/runs/2026-11-29-tags-*.txt measure what one costs; the filters read a
# bounded window of ids instead, as the dashboard's payload search does. Should you want
# one on a large table, build it without blocking writes:
#     CREATE INDEX CONCURRENTLY ... ON sa_jobqueue_jobs USING gin (tags)
# outside a transaction (``op.get_context().autocommit_block()`` in a revision of yours).


def upgrade() -> None:
    op.add_column("sa_jobqueue_jobs", sa.Column("tags", postgresql.ARRAY(sa.Text()), nullable=True))
    op.add_column("sa_jobqueue_jobs", sa.Column("meta", postgresql.JSONB(), nullable=True))


def downgrade() -> None:
    op.drop_column("sa_jobqueue_jobs", "meta")
    op.drop_column("sa_jobqueue_jobs", "tags")
