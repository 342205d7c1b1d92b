"""sa_jobqueue: cluster-wide limits per queue: a concurrency cap, a cap per key, a rate limit.

Revision ID: sajq_0009
Revises: sajq_0008
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from sa_jobqueue.migrations._locks import bound_lock_waits

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
    "key_concurrency": "key_concurrency >= 1",
    "key_field": "char_length(key_field) BETWEEN 1 AND 200",
    "key": "(key_concurrency IS NULL) = (key_field IS NULL)",
}


# A limited claim (sa_jobqueue._sql.claiming.claim_limited) starts with this function. It locks
# the queue's settings row, so the claims of a limited queue take turns, and then reads the row
# and the queue's live holders in a statement of its own: a VOLATILE function's statements each
# take a fresh snapshot, so these see every claim of the queue that committed while this claim
# waited for the lock. Counted in the claim's own snapshot (taken before the wait), those
# claims' jobs would look not yet started and their slots free. PL/pgSQL keeps its statements'
# plans for the session, so a worker's claims do not plan them again.
#
# A slot is held by a job running with a live lease. The holders are the ones the last claim
# recorded, each checked by primary key; until recount_until, and when none are recorded (a
# cap was just set), every running job of the queue is counted instead from the claim index.
# The rate window's start and the starts already in it come back ready for the claim to add
# its own, with how many it may still start and, when none, the seconds until the next one.
LOCK_QUEUE = """
CREATE FUNCTION sa_jobqueue_lock_queue(p_queue text)
RETURNS TABLE (
    is_paused boolean, cap integer, key_cap integer, key_name text, tracked boolean,
    rate_left integer, rate_wait float8, window_start timestamptz, window_used integer,
    live_ids bigint[]
)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    r sa_jobqueue_queues;
    seconds float8;
    current_window timestamptz;
BEGIN
    PERFORM 1 FROM sa_jobqueue_queues q WHERE q.queue = p_queue FOR UPDATE;
    -- A statement of its own: its snapshot sees every claim that committed during the wait.
    SELECT * INTO r FROM sa_jobqueue_queues q WHERE q.queue = p_queue;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    is_paused := r.paused_at IS NOT NULL;
    cap := r.concurrency;
    key_cap := r.key_concurrency;
    key_name := r.key_field;
    tracked := r.concurrency IS NOT NULL OR r.key_concurrency IS NOT NULL;
    IF r.rate_limit IS NOT NULL THEN
        -- Windows of rate_period from the Unix epoch, by this transaction's now().
        seconds := extract(epoch FROM r.rate_period);
        current_window := to_timestamp(floor(extract(epoch FROM now()) / seconds) * seconds);
        IF r.rate_window > current_window THEN
            -- A later claim moved the window on while this one waited: take nothing.
            window_start := r.rate_window;
            window_used := r.rate_count;
            rate_left := 0;
        ELSE
            window_start := current_window;
            window_used := CASE WHEN r.rate_window = current_window THEN r.rate_count ELSE 0 END;
            rate_left := r.rate_limit - window_used;
        END IF;
        IF rate_left <= 0 THEN
            rate_wait := extract(epoch FROM window_start + r.rate_period - clock_timestamp());
        END IF;
    END IF;
    IF NOT tracked THEN
        live_ids := '{}';
    ELSIF r.holders IS NULL OR r.recount_until IS NULL OR r.recount_until > now() THEN
        live_ids := ARRAY(
            SELECT j.id FROM sa_jobqueue_jobs j
            WHERE j.queue = p_queue AND j.status IN ('queued', 'running')
            AND j.status = 'running' AND j.visible_at > now()
        );
    ELSE
        live_ids := ARRAY(
            SELECT j.id FROM sa_jobqueue_jobs j
            WHERE j.id = ANY (r.holders) AND j.status = 'running' AND j.visible_at > now()
        );
    END IF;
    RETURN NEXT;
END
$$
"""


def upgrade() -> None:
    bound_lock_waits()
    op.add_column(TABLE, sa.Column("concurrency", sa.Integer(), nullable=True))
    op.add_column(TABLE, sa.Column("rate_limit", sa.Integer(), nullable=True))
    op.add_column(TABLE, sa.Column("rate_period", sa.Interval(), nullable=True))
    op.add_column(TABLE, sa.Column("rate_window", sa.DateTime(timezone=True), nullable=True))
    op.add_column(
        TABLE, sa.Column("rate_count", sa.Integer(), server_default=sa.text("0"), nullable=False)
    )
    op.add_column(TABLE, sa.Column("key_concurrency", sa.Integer(), nullable=True))
    op.add_column(TABLE, sa.Column("key_field", sa.Text(), nullable=True))
    op.add_column(TABLE, sa.Column("holders", postgresql.ARRAY(sa.BigInteger()), nullable=True))
    op.add_column(TABLE, sa.Column("recount_until", sa.DateTime(timezone=True), nullable=True))
    for name, condition in CHECKS.items():
        op.create_check_constraint(op.f(f"{TABLE}_{name}_check"), TABLE, condition)
    op.execute(LOCK_QUEUE)


def downgrade() -> None:
    bound_lock_waits()
    op.execute("DROP FUNCTION sa_jobqueue_lock_queue(text)")
    for name in CHECKS:
        op.drop_constraint(op.f(f"{TABLE}_{name}_check"), TABLE, type_="check")
    for column in (
        "recount_until",
        "holders",
        "key_field",
        "key_concurrency",
        "rate_count",
        "rate_window",
        "rate_period",
        "rate_limit",
        "concurrency",
    ):
        op.drop_column(TABLE, column)
