"""sa_jobqueue: stored results, a job's return value kept with its completion.

Revision ID: sajq_0011
Revises: sajq_0010
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from sa_jobqueue.migrations._locks import bound_lock_waits

revision = "sajq_0011"
down_revision = "sajq_0010"
branch_labels = None
depends_on = None

# A nullable column without a default: added without rewriting the jobs table, and NULL (no
# bytes) in every row whose task keeps no result.


def upgrade() -> None:
    bound_lock_waits()
    op.add_column("sa_jobqueue_jobs", sa.Column("result", postgresql.JSONB(), nullable=True))


def downgrade() -> None:
    bound_lock_waits()
    op.drop_column("sa_jobqueue_jobs", "result")
