"""sa_jobqueue: an index for pruning finished jobs, and storage settings for a churning table.

Revision ID: sajq_0003
Revises: sajq_0002
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sa_jobqueue.migrations._locks import bound_lock_waits

revision = "sajq_0003"
down_revision = "sajq_0002"
branch_labels = None
depends_on = None

# Every job row is updated several times (claim, renewals, outcome) and then deleted by
# pruning. Free space on each page lets a row's new version stay on its page, and vacuuming
# after 2% instead of 20% of the rows changed keeps dead tuples from piling up in front of the
# claim's index scan.


def upgrade() -> None:
    bound_lock_waits()
    op.create_index(
        "sa_jobqueue_jobs_prune_idx",
        "sa_jobqueue_jobs",
        ["finished_at"],
        postgresql_where=sa.text("status IN ('succeeded', 'cancelled')"),
    )
    op.execute(
        "ALTER TABLE sa_jobqueue_jobs SET (fillfactor = 70,"
        " autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_insert_scale_factor = 0.02,"
        " autovacuum_analyze_scale_factor = 0.02)"
    )


def downgrade() -> None:
    bound_lock_waits()
    op.execute(
        "ALTER TABLE sa_jobqueue_jobs RESET (fillfactor, autovacuum_vacuum_scale_factor,"
        " autovacuum_vacuum_insert_scale_factor, autovacuum_analyze_scale_factor)"
    )
    op.drop_index("sa_jobqueue_jobs_prune_idx", table_name="sa_jobqueue_jobs")
