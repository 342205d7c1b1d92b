"""Alembic environment used by ``sa-jobqueue migrate``."""

from alembic import context

from sa_jobqueue.migrations import run_env

run_env(context)
