"""sa_jobqueue: rate limits per key: at most N starts per period for each key of a queue.

Revision ID: sajq_0010
Revises: sajq_0009
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sa_jobqueue.migrations._locks import bound_lock_waits

revision = "sajq_0010"
down_revision = "sajq_0009"
branch_labels = None
depends_on = None

TABLE = "sa_jobqueue_queues"
STARTS = "sa_jobqueue_key_starts"

# A queue has one key field, shared by its cap per key and its rate per key: it is set while
# either is. Nullable columns without defaults are added without rewriting the table.
OLD_KEY = "(key_concurrency IS NULL) = (key_field IS NULL)"
NEW_KEY = "(key_field IS NULL) = (key_concurrency IS NULL AND key_rate_limit IS NULL)"
CHECKS = {
    "key_rate_limit": "key_rate_limit >= 1",
    "key_rate_period": "key_rate_period >= interval '1 millisecond'",
    "key_rate": "(key_rate_limit IS NULL) = (key_rate_period IS NULL)",
}

# The limited claim of a queue with a rate per key calls this once the queue's row is locked
# (it takes an argument computed from sa_jobqueue_lock_queue's row, so it runs after it). A
# VOLATILE function's statement takes a fresh snapshot: it sees the starts of every claim of
# the queue that committed while this claim waited for the lock, which the claim's own
# snapshot, taken before the wait, would miss. Only the keys the claim looks at are read.
# A row whose window is later than p_window was written by a claim that began after this
# one's now() and committed first: its key counts as used up here (the largest integer), so
# this late claim starts none of its jobs, whose start times would fall in a window whose
# count has moved on (as the queue's own rate does in sa_jobqueue_lock_queue).
KEY_STARTS = """
CREATE FUNCTION sa_jobqueue_key_starts(
    p_queue text, p_window timestamptz, p_tasks text[], p_keys text[]
)
RETURNS TABLE (task text, key text, starts integer)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY
    SELECT s.task, s.key, CASE WHEN s.window_start > p_window THEN 2147483647 ELSE s.starts END
    FROM (SELECT DISTINCT c.task, c.key FROM unnest(p_tasks, p_keys) AS c (task, key)) AS c
    JOIN sa_jobqueue_key_starts s ON s.queue = p_queue AND s.task = c.task AND s.key = c.key
    WHERE s.window_start >= p_window;
END
$$
"""


def upgrade() -> None:
    bound_lock_waits()
    op.add_column(TABLE, sa.Column("key_rate_limit", sa.Integer(), nullable=True))
    op.add_column(TABLE, sa.Column("key_rate_period", sa.Interval(), nullable=True))
    op.drop_constraint(op.f(f"{TABLE}_key_check"), TABLE, type_="check")
    op.create_check_constraint(op.f(f"{TABLE}_key_check"), TABLE, NEW_KEY)
    for name, condition in CHECKS.items():
        op.create_check_constraint(op.f(f"{TABLE}_{name}_check"), TABLE, condition)
    op.create_table(
        STARTS,
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("task", sa.Text(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("starts", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("queue", "task", "key", name=op.f(f"{STARTS}_pkey")),
    )
    op.execute(KEY_STARTS)


def downgrade() -> None:
    bound_lock_waits()
    op.execute("DROP FUNCTION sa_jobqueue_key_starts(text, timestamptz, text[], text[])")
    op.drop_table(STARTS)
    for name in CHECKS:
        op.drop_constraint(op.f(f"{TABLE}_{name}_check"), TABLE, type_="check")
    op.drop_constraint(op.f(f"{TABLE}_key_check"), TABLE, type_="check")
    # Rows with a rate per key and no cap per key cannot keep their key field under the old
    # rule: their rate per key goes with the revision, and so does the field.
    op.execute(
        "UPDATE sa_jobqueue_queues SET key_field = NULL"
        " WHERE key_concurrency IS NULL AND key_field IS NOT NULL"
    )
    op.create_check_constraint(op.f(f"{TABLE}_key_check"), TABLE, OLD_KEY)
    op.drop_column(TABLE, "key_rate_period")
    op.drop_column(TABLE, "key_rate_limit")
