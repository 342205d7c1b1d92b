"""sa_jobqueue: an index of dead jobs, by queue and when they died.

Revision ID: sajq_0006
Revises: sajq_0005
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sa_jobqueue.migrations._locks import bound_lock_waits

revision = "sajq_0006"
down_revision = "sajq_0005"
branch_labels = None
depends_on = None

# Dead jobs stay until someone requeues or purges them, among finished history that no other
# index covers (the prune index holds succeeded and cancelled jobs only). Counting them per
# queue, or those that died in the last hour, read the whole table without this index. It
# holds dead rows only, so a job that succeeds never writes to it.


def upgrade() -> None:
    bound_lock_waits()
    op.create_index(
        "sa_jobqueue_jobs_dead_idx",
        "sa_jobqueue_jobs",
        ["queue", "finished_at"],
        postgresql_where=sa.text("status = 'dead'"),
    )


def downgrade() -> None:
    bound_lock_waits()
    op.drop_index("sa_jobqueue_jobs_dead_idx", table_name="sa_jobqueue_jobs")
