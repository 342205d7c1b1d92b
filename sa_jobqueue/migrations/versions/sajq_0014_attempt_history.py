"""sa_jobqueue: attempt history, how each attempt that did not succeed ended, kept with its job.

Revision ID: sajq_0014
Revises: sajq_0013
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "sajq_0014"
down_revision = "sajq_0013"
branch_labels = None
depends_on = None

# A nullable column without a default, as sajq_0011's ``result``: PostgreSQL changes the
# catalog only and rewrites no row (NULL costs no bytes in the rows that never fail, and
# enqueues write nothing more). The ALTER takes an ACCESS EXCLUSIVE lock on the jobs table
# for as long as the catalog change takes: measured at 1,000,000 rows on PostgreSQL 15, the
# same few milliseconds as on an empty table. It must first wait for that lock, though, and
# queues everything behind it meanwhile: a worker's statements wait for a long transaction
# that holds the table (a long report, say) to end. Set a lock_timeout in the migration's
# session to bound that wait.


def upgrade() -> None:
    op.add_column(
        "sa_jobqueue_jobs", sa.Column("attempt_history", postgresql.JSONB(), nullable=True)
    )


def downgrade() -> None:
    op.drop_column("sa_jobqueue_jobs", "attempt_history")
