"""sa_jobqueue: a table of per-queue flow settings, with the paused state.

Revision ID: sajq_0007
Revises: sajq_0006
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sa_jobqueue.migrations._locks import bound_lock_waits

revision = "sajq_0007"
down_revision = "sajq_0006"
branch_labels = None
depends_on = None

# One row per queue an operator has set something on; queues without a row run as before.
# The claim probes this table's primary key for the queue it claims from, so the table stays
# small (one row per queue, never per job) and adds one index lookup to a claim.


def upgrade() -> None:
    bound_lock_waits()
    op.create_table(
        "sa_jobqueue_queues",
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("paused_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "char_length(queue) BETWEEN 1 AND 64", name=op.f("sa_jobqueue_queues_queue_check")
        ),
        sa.PrimaryKeyConstraint("queue", name=op.f("sa_jobqueue_queues_pkey")),
    )


def downgrade() -> None:
    bound_lock_waits()
    op.drop_table("sa_jobqueue_queues")
