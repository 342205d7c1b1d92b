"""Alembic environment of this repository: ``alembic upgrade head`` from the repository root.

The revisions themselves live in the package (``sa_jobqueue/migrations/versions``) so that an
installed wheel carries them; alembic.ini points ``version_locations`` there.
"""

from logging.config import fileConfig

from alembic import context

from sa_jobqueue.migrations import run_env

if context.config.config_file_name is not None:
    fileConfig(context.config.config_file_name)

run_env(context)
