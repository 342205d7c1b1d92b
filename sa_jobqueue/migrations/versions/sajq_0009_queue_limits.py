"""sa_jobqueue: cluster-wide limits per queue, a concurrency cap and a rate limit.

Revision ID: sajq_0009
Revises: sajq_0008
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "sajq_0009"
down_revision = "sajq_0008"
branch_labels = None
depends_on = None

# Columns of the queues table only (one row per queue an operator has set something on): the
# jobs table, and so the claim of a queue without limits, is untouched. Nullable columns
# without defaults, and one with a constant default, are added without rewriting the table.

TABLE = "sa_jobqueue_queues"
CHECKS = {
    "concurrency": "concurrency >= 1",
    "rate_limit": "rate_limit >= 1",
    "rate_period": "rate_period >= interval '1 millisecond'",
    "rate": "(rate_limit IS NULL) = (rate_period IS NULL)",
    "rate_count": "rate_count >= 0",
}


def upgrade() -> None:
    op.add_column(TABLE, sa.Column("concurrency", sa.Integer(), nullable=True))
    op.add_column(TABLE, sa.Column("rate_limit", sa.Integer(), nullable=True))
    op.add_column(TABLE, sa.Column("rate_period", sa.Interval(), nullable=True))
    op.add_column(TABLE, sa.Column("rate_window", sa.DateTime(timezone=True), nullable=True))
    op.add_column(
        TABLE, sa.Column("rate_count", sa.Integer(), server_default=sa.text("0"), nullable=False)
    )
    op.add_column(TABLE, sa.Column("holders", postgresql.ARRAY(sa.BigInteger()), nullable=True))
    op.add_column(TABLE, sa.Column("recount_until", sa.DateTime(timezone=True), nullable=True))
    for name, condition in CHECKS.items():
        op.create_check_constraint(op.f(f"{TABLE}_{name}_check"), TABLE, condition)


def downgrade() -> None:
    for name in CHECKS:
        op.drop_constraint(op.f(f"{TABLE}_{name}_check"), TABLE, type_="check")
    for column in (
        "recount_until",
        "holders",
        "rate_count",
        "rate_window",
        "rate_period",
        "rate_limit",
        "concurrency",
    ):
        op.drop_column(TABLE, column)
