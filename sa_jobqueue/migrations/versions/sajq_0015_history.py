"""sa_jobqueue: the hourly history of finished jobs per queue, and how far it is folded in.

Revision ID: sajq_0015
Revises: sajq_0014
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sa_jobqueue.migrations._locks import bound_lock_waits

revision = "sajq_0015"
down_revision = "sajq_0014"
branch_labels = None
depends_on = None

# Two new tables: nothing is done to the jobs table, so no lock on it is taken. The history
# starts at the upgrade (folded_to = now()): the jobs that finished before it are not counted,
# and pruning, which waits for the fold, may delete them as before.


def upgrade() -> None:
    bound_lock_waits()
    op.create_table(
        "sa_jobqueue_history",
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("succeeded", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("dead", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("cancelled", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.PrimaryKeyConstraint("queue", "hour", name=op.f("sa_jobqueue_history_pkey")),
    )
    op.create_table(
        "sa_jobqueue_history_mark",
        sa.Column("one", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column("folded_to", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("one", name=op.f("sa_jobqueue_history_mark_one_row_check")),
        sa.PrimaryKeyConstraint("one", name=op.f("sa_jobqueue_history_mark_pkey")),
    )
    op.execute("INSERT INTO sa_jobqueue_history_mark (folded_to) VALUES (now())")


def downgrade() -> None:
    bound_lock_waits()
    op.drop_table("sa_jobqueue_history_mark")
    op.drop_table("sa_jobqueue_history")
