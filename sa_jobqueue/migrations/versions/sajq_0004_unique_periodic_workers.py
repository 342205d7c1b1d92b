"""sa_jobqueue: unique jobs, periodic schedules, the worker registry, trace context.

Revision ID: sajq_0004
Revises: sajq_0003
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from sa_jobqueue.migrations._locks import bound_lock_waits

revision = "sajq_0004"
down_revision = "sajq_0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bound_lock_waits()
    # Nullable columns without defaults: added without rewriting the table.
    op.add_column("sa_jobqueue_jobs", sa.Column("unique_key", sa.Text(), nullable=True))
    op.add_column(
        "sa_jobqueue_jobs",
        sa.Column("trace_context", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )
    op.create_index(
        "sa_jobqueue_jobs_unique_idx",
        "sa_jobqueue_jobs",
        ["task", "unique_key"],
        unique=True,
        postgresql_where=sa.text("unique_key IS NOT NULL AND status IN ('queued', 'running')"),
    )
    op.create_table(
        "sa_jobqueue_periodic",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("last_tick", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("sa_jobqueue_periodic_pkey")),
    )
    op.create_table(
        "sa_jobqueue_workers",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("queues", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column(
            "started_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "last_seen_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("sa_jobqueue_workers_pkey")),
    )


def downgrade() -> None:
    bound_lock_waits()
    op.drop_table("sa_jobqueue_workers")
    op.drop_table("sa_jobqueue_periodic")
    op.drop_index("sa_jobqueue_jobs_unique_idx", table_name="sa_jobqueue_jobs")
    op.drop_column("sa_jobqueue_jobs", "trace_context")
    op.drop_column("sa_jobqueue_jobs", "unique_key")
