"""sa_jobqueue: workflows as objects: each job of one carries its id (and its step's name).

Revision ID: sajq_0017
Revises: sajq_0016
Create Date: 2026-11-28
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import sqlalchemy as sa
from alembic import op

from sa_jobqueue._pooler import OUTSIDE_TRANSACTION
from sa_jobqueue.migrations._locks import bound_lock_waits

revision = "sajq_0017"
down_revision = "sajq_0016"
branch_labels = None
depends_on = None

JOBS = "sa_jobqueue_jobs"
INDEX = "sa_jobqueue_jobs_workflow_id_workflow_step_idx"
CREATE_SEQUENCE = "CREATE SEQUENCE IF NOT EXISTS sa_jobqueue_workflow_ids"
DROP_SEQUENCE = "DROP SEQUENCE IF EXISTS sa_jobqueue_workflow_ids"
DROP_INDEX = "DROP INDEX CONCURRENTLY IF EXISTS {index}"

# What this locks, and for how long:
#
# * The two columns are nullable and have no default: PostgreSQL changes the catalog only and
#   rewrites no row (as sajq_0011 and sajq_0014 did; measured there at a few ms on 1,000,000
#   rows). Each ALTER takes an ACCESS EXCLUSIVE lock on the jobs table, held to the first
#   commit below (the autocommit block commits the transaction before the index is built), so
#   for milliseconds once granted. Everything that touches the table queues behind an ALTER
#   that waits for its lock: set a ``lock_timeout`` in the migration's session to bound that
#   wait, and run again if it runs out (the revision is not recorded until its end, and each
#   step below can run again).
# * The sequence is a new object: no lock on the jobs table.
# * The index is built CONCURRENTLY, outside the transaction: a SHARE UPDATE EXCLUSIVE lock,
#   which lets enqueues, claims and completions go on, for as long as two scans of the table
#   take (seconds for a million rows). Existing jobs have no workflow, so the partial index
#   starts empty and nothing is backfilled. A build that fails (or is interrupted) leaves an
#   INVALID index behind: it is dropped, concurrently, before the build is tried again.


def upgrade() -> None:
    bound_lock_waits()
    op.add_column(JOBS, sa.Column("workflow_id", sa.BigInteger(), nullable=True))
    op.add_column(JOBS, sa.Column("workflow_step", sa.Text(), nullable=True))
    op.execute(CREATE_SEQUENCE)
    schema = _schema()
    with _outside_transaction():
        _drop_index(schema)
        op.create_index(
            INDEX,
            JOBS,
            ["workflow_id", "workflow_step"],
            unique=True,
            postgresql_where=sa.text("workflow_id IS NOT NULL"),
            postgresql_concurrently=True,
            schema=schema,
        )


def downgrade() -> None:
    bound_lock_waits()
    # Jobs keep running as plain jobs with their dependency edges; only the workflow ids go.
    schema = _schema()
    with _outside_transaction():
        _drop_index(schema)
    op.drop_column(JOBS, "workflow_step")
    op.drop_column(JOBS, "workflow_id")
    op.execute(DROP_SEQUENCE)


def _schema() -> str | None:
    """The schema the jobs table is in, as this migration's transaction finds it (its
    ``search_path``); None when writing SQL offline (``--sql``), whose statements are then
    left unqualified, to run with the search_path of whoever runs them."""
    if op.get_context().as_sql:
        return None
    schema: str = (
        op.get_bind()
        .execute(
            sa.text(
                "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE c.oid = to_regclass(:table)"
            ),
            {"table": JOBS},
        )
        .scalar_one()
    )
    return schema


@contextlib.contextmanager
def _outside_transaction() -> Iterator[None]:
    """Alembic's autocommit block, its statements sent outside any transaction block even
    behind a transaction pooler (where each would otherwise get one of its own, to carry the
    session's settings: see ``sa_jobqueue._pooler.OUTSIDE_TRANSACTION``). Without those
    settings, no ``search_path`` either: the statements name the schema."""
    with op.get_context().autocommit_block():
        if op.get_context().as_sql:
            yield
            return
        bind = op.get_bind()
        bind.execution_options(**{OUTSIDE_TRANSACTION: True})
        try:
            yield
        finally:
            bind.execution_options(**{OUTSIDE_TRANSACTION: False})


def _drop_index(schema: str | None) -> None:
    """Drop an index a failed concurrent build left behind (none: nothing to do)."""
    quote = op.get_context().dialect.identifier_preparer.quote
    name = quote(INDEX) if schema is None else f"{quote(schema)}.{quote(INDEX)}"
    op.execute(sa.text(DROP_INDEX.format(index=name)))
