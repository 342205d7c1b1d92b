"""sa_jobqueue: cancel_requested, so a running job can be asked to stop.

Revision ID: sajq_0002
Revises: sajq_0001
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sa_jobqueue.migrations._locks import bound_lock_waits

revision = "sajq_0002"
down_revision = "sajq_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bound_lock_waits()
    # A constant default: PostgreSQL 11+ adds the column without rewriting the table.
    op.add_column(
        "sa_jobqueue_jobs",
        sa.Column(
            "cancel_requested", sa.Boolean(), server_default=sa.text("false"), nullable=False
        ),
    )


def downgrade() -> None:
    bound_lock_waits()
    op.drop_column("sa_jobqueue_jobs", "cancel_requested")
