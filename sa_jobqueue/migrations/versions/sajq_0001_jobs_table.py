"""sa_jobqueue: the jobs table and its claim index.

Revision ID: sajq_0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from sa_jobqueue.errors import SchemaManagedElsewhereError
from sa_jobqueue.migrations._locks import bound_lock_waits

revision = "sajq_0001"
down_revision = None
branch_labels = ("sa_jobqueue",)
depends_on = None

# Revisions spell the schema out instead of importing the models: the models will move on,
# and a revision must keep creating what it created on the day it was written. Names are
# wrapped in op.f(): they are final, and the models' naming convention must not wrap them
# again.


def upgrade() -> None:
    bound_lock_waits()
    _refuse_existing_tables()
    op.create_table(
        "sa_jobqueue_jobs",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), primary_key=True),
        sa.Column("queue", sa.Text(), server_default=sa.text("'default'"), nullable=False),
        sa.Column("task", sa.Text(), nullable=False),
        sa.Column("payload", postgresql.JSONB(), nullable=False),
        sa.Column("status", sa.Text(), server_default=sa.text("'queued'"), nullable=False),
        sa.Column("priority", sa.SmallInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("max_attempts", sa.Integer(), server_default=sa.text("5"), nullable=False),
        sa.Column("lease", sa.Interval(), server_default=sa.text("'00:00:30'"), nullable=False),
        sa.Column(
            "visible_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("worker", sa.Text(), nullable=True),
        sa.Column("last_error", postgresql.JSONB(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("sa_jobqueue_jobs_pkey")),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'succeeded', 'dead', 'cancelled')",
            name=op.f("sa_jobqueue_jobs_status_check"),
        ),
        sa.CheckConstraint(
            "char_length(queue) BETWEEN 1 AND 64", name=op.f("sa_jobqueue_jobs_queue_check")
        ),
        sa.CheckConstraint(
            "char_length(task) BETWEEN 1 AND 200", name=op.f("sa_jobqueue_jobs_task_check")
        ),
        sa.CheckConstraint("max_attempts >= 1", name=op.f("sa_jobqueue_jobs_max_attempts_check")),
        sa.CheckConstraint(
            "attempts BETWEEN 0 AND max_attempts", name=op.f("sa_jobqueue_jobs_attempts_check")
        ),
        sa.CheckConstraint("lease > interval '0'", name=op.f("sa_jobqueue_jobs_lease_check")),
        sa.CheckConstraint(
            "(finished_at IS NOT NULL) = (status IN ('succeeded', 'dead', 'cancelled'))",
            name=op.f("sa_jobqueue_jobs_finished_check"),
        ),
    )
    op.create_index(
        "sa_jobqueue_jobs_claim_idx",
        "sa_jobqueue_jobs",
        ["queue", "priority", "visible_at", "id"],
        postgresql_where=sa.text("status IN ('queued', 'running')"),
    )


def _refuse_existing_tables() -> None:
    """Stop with one clear sentence where CREATE TABLE would fail with DuplicateTable: the
    tables exist, but the version table this history keeps records none of our revisions."""
    context = op.get_context()
    if context.as_sql:
        return  # offline (--sql): no database to look at
    bind = op.get_bind()
    if bind.execute(sa.select(sa.func.to_regclass("sa_jobqueue_jobs"))).scalar() is None:
        return
    elsewhere = []
    for table in ("sa_jobqueue_alembic_version", "alembic_version"):
        if table == context.version_table:
            continue
        if bind.execute(sa.select(sa.func.to_regclass(table))).scalar() is None:
            continue
        versions = sa.table(table, sa.column("version_num", sa.Text))
        found = bind.execute(
            sa.select(versions.c.version_num).where(versions.c.version_num.startswith("sajq_"))
        ).scalars()
        elsewhere += [f"{revision} in {table}" for revision in found]
    if elsewhere:
        raise SchemaManagedElsewhereError(
            "table sa_jobqueue_jobs already exists, installed by another route (revision"
            f" {', '.join(elsewhere)}): keep upgrading it that way, or move it to this history"
            " with `alembic stamp <that revision>` here"
        )
    raise SchemaManagedElsewhereError(
        "table sa_jobqueue_jobs already exists, with no sa_jobqueue revision recorded for it"
        " (made with metadata.create_all?): record the revision it matches with"
        " `alembic stamp <revision>` instead of upgrading"
    )


def downgrade() -> None:
    bound_lock_waits()
    op.drop_index("sa_jobqueue_jobs_claim_idx", table_name="sa_jobqueue_jobs")
    op.drop_table("sa_jobqueue_jobs")
