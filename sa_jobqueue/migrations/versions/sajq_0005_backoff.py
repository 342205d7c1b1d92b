"""sa_jobqueue: a job's own retry policy, for enqueue(..., backoff=...).

Revision ID: sajq_0005
Revises: sajq_0004
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from sa_jobqueue.migrations._locks import bound_lock_waits

revision = "sajq_0005"
down_revision = "sajq_0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bound_lock_waits()
    # Nullable, no default: added without rewriting the table.
    op.add_column(
        "sa_jobqueue_jobs",
        sa.Column("backoff", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )


def downgrade() -> None:
    bound_lock_waits()
    op.drop_column("sa_jobqueue_jobs", "backoff")
