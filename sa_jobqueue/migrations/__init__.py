"""sa_jobqueue's Alembic revisions and the code both of our Alembic environments run.

The revisions in ``versions/`` carry the branch label ``sa_jobqueue`` and ids prefixed
``sajq_``, on a base of their own, so they can join an application's Alembic history::

    # alembic.ini of your application (path_separator = space)
    version_locations = %(here)s/alembic/versions sa_jobqueue:migrations/versions

and ``alembic upgrade heads`` applies ours next to yours. Run on their own (``sa-jobqueue
migrate`` or ``alembic upgrade head`` from this repository) they record their revision in a
version table of their own, ``sa_jobqueue_alembic_version``, so they never meet an
application's ``alembic_version``. Pick one of the two ways per database.
"""

from __future__ import annotations

from typing import Any, Final

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine

from ..models import metadata

#: Where ``sa-jobqueue migrate`` and this repository's alembic.ini record the applied revision.
VERSION_TABLE: Final = "sa_jobqueue_alembic_version"
#: Our revisions, as a package resource that works from an installed wheel.
VERSION_LOCATION: Final = "sa_jobqueue:migrations/versions"


def run_env(context: Any) -> None:
    """The body of an env.py that runs our revisions on their own (online mode only).

    The connection comes from ``config.attributes["connection"]`` when a program passes one
    (``sa-jobqueue migrate``), else from ``-x url=...``, ``DATABASE_URL`` or ``sqlalchemy.url``.
    """
    import os

    from ..database import create_engine

    config = context.config
    connection = config.attributes.get("connection")
    if connection is not None:
        _migrate(context, connection)
        return
    url = (
        context.get_x_argument(as_dictionary=True).get("url")
        or os.environ.get("DATABASE_URL")
        or config.get_main_option("sqlalchemy.url")
    )
    if not url:
        raise SystemExit("no database: pass -x url=..., set DATABASE_URL or sqlalchemy.url")
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            _migrate(context, conn)
    finally:
        engine.dispose()


def _migrate(context: Any, connection: Any) -> None:
    context.configure(connection=connection, target_metadata=metadata, version_table=VERSION_TABLE)
    with context.begin_transaction():
        context.run_migrations()
    if connection.in_transaction():
        connection.commit()


def upgrade(engine: Engine, revision: str = "heads") -> None:
    """Bring the database's sa_jobqueue schema up to ``revision`` (default: the newest)."""
    config = Config()
    config.set_main_option("script_location", "sa_jobqueue:migrations")
    config.set_main_option("path_separator", "space")
    config.set_main_option("version_locations", VERSION_LOCATION)
    with engine.connect() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, revision)
