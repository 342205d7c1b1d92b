"""sa_jobqueue: unique periods, the window a job's key is held in after it finished.

Revision ID: sajq_0008
Revises: sajq_0007
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sa_jobqueue.migrations._locks import bound_lock_waits

revision = "sajq_0008"
down_revision = "sajq_0007"
branch_labels = None
depends_on = None

# A nullable column without a default is added without rewriting the table. The index holds
# only rows that have a window (none yet), so building it reads the table once and writes
# nothing; it does hold a SHARE lock on the table (enqueues wait) for that read.


def upgrade() -> None:
    bound_lock_waits()
    op.add_column(
        "sa_jobqueue_jobs", sa.Column("unique_window", sa.DateTime(timezone=True), nullable=True)
    )
    op.create_index(
        "sa_jobqueue_jobs_unique_window_idx",
        "sa_jobqueue_jobs",
        ["task", "unique_key", "unique_window"],
        unique=True,
        postgresql_where=sa.text("unique_window IS NOT NULL"),
    )


def downgrade() -> None:
    bound_lock_waits()
    op.drop_index("sa_jobqueue_jobs_unique_window_idx", table_name="sa_jobqueue_jobs")
    op.drop_column("sa_jobqueue_jobs", "unique_window")
