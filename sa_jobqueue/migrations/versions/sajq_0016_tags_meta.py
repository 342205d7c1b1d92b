"""sa_jobqueue: tags and meta, the labels and the JSON object an enqueue keeps with its job.

Revision ID: sajq_0016
Revises: sajq_0015
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from sa_jobqueue.migrations._locks import bound_lock_waits

revision = "sajq_0016"
down_revision = "sajq_0015"
branch_labels = None
depends_on = None

# Two nullable columns without defaults, as sajq_0014's ``attempt_history``: PostgreSQL 11+
# changes the catalog only and rewrites no row (NULL costs no bytes in the rows of jobs
# enqueued without tags or meta, and their enqueues send the statements they sent before).
# Each ALTER takes an ACCESS EXCLUSIVE lock on the jobs table, held to the migration's
# commit: measured on PostgreSQL 15 with 1,000,000 rows (217 MB), the two ALTERs took 1.3 ms
# and the commit 1.2 ms, and the table kept its file and its size (no rewrite); a busy 2-core
# machine. The lock must first be granted, though, and everything that touches the table
# queues behind the ALTER while it waits: a long transaction holding any lock on the jobs
# table holds up the workers' claims and completions until it ends. Set a ``lock_timeout`` in
# the migration's session to bound that wait, and retry if it runs out.
#
# No index, so nothing to build CONCURRENTLY: the claim and the completion never read these
# columns, but they update the row in a way that is never HOT (the claim index's columns
# change), so every index of the table takes an entry at each claim and each completion (a GIN
# index keeps one for a row whose tags are NULL too). With a GIN index on tags, the claim and
# completion of tagged jobs wrote 54% more WAL per job (bench/runs/2026-11-29-tags-index-cost
# .txt), to serve an operator's filter; the filters read a bounded window of ids instead, as
# the dashboard's payload search does.


def upgrade() -> None:
    bound_lock_waits()
    op.add_column("sa_jobqueue_jobs", sa.Column("tags", postgresql.ARRAY(sa.Text()), nullable=True))
    op.add_column("sa_jobqueue_jobs", sa.Column("meta", postgresql.JSONB(), nullable=True))


def downgrade() -> None:
    bound_lock_waits()
    op.drop_column("sa_jobqueue_jobs", "meta")
    op.drop_column("sa_jobqueue_jobs", "tags")
