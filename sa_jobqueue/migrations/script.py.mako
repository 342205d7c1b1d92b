"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
${imports if imports else ""}
from sa_jobqueue.migrations._locks import bound_lock_waits

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = ${repr(branch_labels)}
depends_on = ${repr(depends_on)}


def upgrade() -> None:
    bound_lock_waits()
    ${upgrades if upgrades else "pass"}


def downgrade() -> None:
    bound_lock_waits()
    ${downgrades if downgrades else "pass"}
