"""sa_jobqueue: progress, the latest fraction and message a running job's handler reported.

Revision ID: sajq_0018
Revises: sajq_0017
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sa_jobqueue.migrations._locks import bound_lock_waits

revision = "sajq_0018"
down_revision = "sajq_0017"
branch_labels = None
depends_on = None

# Three nullable columns without defaults, as sajq_0016's tags and meta: PostgreSQL 11+
# changes the catalog only and rewrites no row (NULL costs no bytes in the rows of jobs that
# never report progress). Each ALTER takes an ACCESS EXCLUSIVE lock on the jobs table; the
# first takes it and it is held to the migration's commit. Measured on PostgreSQL 15 with
# 1,000,000 rows (264 MB): the three ALTERs took 1.1, 0.2 and 0.2 ms and the commit 0.4 ms,
# and the table kept its file and its size (no rewrite); a busy 2-core machine (load average
# 5.8). The lock must first be granted, though, and everything that touches the table queues
# behind the ALTER while it waits: a long transaction holding any lock on the jobs table
# holds up the workers' claims and completions until it ends. Set a ``lock_timeout`` in the
# migration's session to bound that wait, and retry if it runs out.
#
# No CHECK constraint (``progress BETWEEN 0 AND 1``): adding one reads every row to validate
# it while the lock is held; the worker checks each report when the handler makes it. No
# index: nothing looks jobs up by their progress, and the heartbeat's renewal, which writes
# it, finds its rows by primary key.


def upgrade() -> None:
    bound_lock_waits()
    op.add_column("sa_jobqueue_jobs", sa.Column("progress", sa.Double(), nullable=True))
    op.add_column("sa_jobqueue_jobs", sa.Column("progress_message", sa.Text(), nullable=True))
    op.add_column(
        "sa_jobqueue_jobs",
        sa.Column("progress_at", sa.DateTime(timezone=True), nullable=True),
    )


def downgrade() -> None:
    bound_lock_waits()
    op.drop_column("sa_jobqueue_jobs", "progress_at")
    op.drop_column("sa_jobqueue_jobs", "progress_message")
    op.drop_column("sa_jobqueue_jobs", "progress")
