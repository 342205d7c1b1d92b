"""sa_jobqueue's Alembic revisions, the code both of our Alembic environments run, and the hooks
an application's env.py uses when our revisions join its history.

The revisions in ``versions/`` carry the branch label ``sa_jobqueue`` and ids prefixed
``sajq_``, on a base of their own, so they can join an application's Alembic history::

    # alembic.ini of your application (path_separator = space)
    version_locations = %(here)s/migrations/versions sa_jobqueue:migrations/versions
    revision_environment = true

with :func:`include_object` and :func:`process_revision_directives` passed to
``context.configure()`` in its env.py, and ``alembic upgrade heads`` applies ours next to yours.
Run on their own (``sa-jobqueue migrate`` or ``alembic upgrade head`` from this repository) they
record their revision in a version table of their own, ``sa_jobqueue_alembic_version``, so they
never meet an application's ``alembic_version``. Pick one of the two ways per database: our own
route finding our revisions in ``alembic_version`` does nothing at our head and refuses to
install the tables again below it (:class:`~sa_jobqueue.errors.SchemaManagedElsewhereError`).
"""

from __future__ import annotations

from typing import Any, Final

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import OperationalError

from ..database import recorded
from ..errors import (
    JobQueueError,
    MigrationLockTimeoutError,
    SchemaManagedElsewhereError,
    SchemaOutdatedError,
)
from ..models import metadata
from ._hooks import include_object, process_revision_directives
from ._locks import LOCK_TIMEOUT

__all__ = [
    "APPLICATION_VERSION_TABLE",
    "VERSION_LOCATION",
    "VERSION_TABLE",
    "include_object",
    "process_revision_directives",
    "run_env",
    "upgrade",
]

#: PostgreSQL's SQLSTATE for a lock not granted within ``lock_timeout`` (lock_not_available).
LOCK_NOT_AVAILABLE: Final = "55P03"
#: Where ``sa-jobqueue migrate`` and this repository's alembic.ini record the applied revision.
VERSION_TABLE: Final = "sa_jobqueue_alembic_version"
#: Our revisions, as a package resource that works from an installed wheel.
VERSION_LOCATION: Final = "sa_jobqueue:migrations/versions"
#: Where an application's Alembic history records revisions, ours included when they joined it
#: (Alembic's default name; a history that renamed its version table is not looked for).
APPLICATION_VERSION_TABLE: Final = "alembic_version"


def run_env(context: Any) -> None:
    """The body of an env.py that runs our revisions on their own (online mode only).

    The connection comes from ``config.attributes["connection"]`` when a program passes one
    (``sa-jobqueue migrate``), else from ``-x url=...``, ``DATABASE_URL`` or ``sqlalchemy.url``.
    A program gets our errors as they are; the ``alembic`` command gets their message as one
    line (SystemExit), not a traceback.
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
    except JobQueueError as exc:
        raise SystemExit(str(exc)) from exc
    finally:
        engine.dispose()


def _migrate(context: Any, connection: Connection) -> None:
    began = not connection.in_transaction()
    try:
        if _installed_by_the_application(context.script, connection):
            return
    finally:
        if began and connection.in_transaction():
            connection.rollback()  # only read; Alembic begins its own transaction below
    # A transaction per revision: each commits, and lets go of its locks, as it ends, so an
    # upgrade over several revisions holds up the queue for one revision's locks at a time,
    # not for all of them until the last; one that fails leaves those before it applied.
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        transaction_per_migration=True,
    )
    try:
        with context.begin_transaction():
            context.run_migrations()
    except OperationalError as exc:
        if getattr(exc.orig, "sqlstate", None) != LOCK_NOT_AVAILABLE:
            raise
        if connection.in_transaction():
            connection.rollback()
        raise MigrationLockTimeoutError(
            "the upgrade gave up waiting for a lock on a sa_jobqueue table (its lock_timeout"
            f" ran out; {LOCK_TIMEOUT} unless the session sets one): a long transaction holds"
            " it (see pg_stat_activity); the workers went on; the revisions applied before"
            " it are kept: run `sa-jobqueue migrate` again"
        ) from exc
    if connection.in_transaction():
        connection.commit()


def _installed_by_the_application(script: ScriptDirectory, connection: Connection) -> bool:
    """Whether our own route must leave this database alone, because an application's Alembic
    history installed our schema: True when that history has it at our head (nothing to do);
    SchemaManagedElsewhereError when it has it below (installing again would fail on the
    existing tables) or above (this package is too old for it).

    Only our own version table decides otherwise: once it records a revision, this route owns
    the schema and Alembic carries on as usual. Reads in the connection's transaction and
    leaves it open (Alembic's ``begin_transaction`` carries on in it).
    """
    known = {rev.revision for rev in script.walk_revisions()}
    ours = recorded(connection, VERSION_TABLE)
    if ours:
        unknown = [rev for rev in ours if rev not in known]
        if unknown:
            raise SchemaOutdatedError(
                f"found sa_jobqueue's schema at revision {unknown[0]} in {VERSION_TABLE}, newer"
                f" than this version of sa_jobqueue knows ({', '.join(script.get_heads())}):"
                " upgrade the sa_jobqueue package"
            )
        return False
    theirs = recorded(connection, APPLICATION_VERSION_TABLE)
    if not theirs:
        return False
    heads = set(script.get_heads())
    if set(theirs) <= heads:
        return True
    found = (
        f"found sa_jobqueue's schema at revision {', '.join(theirs)} in {APPLICATION_VERSION_TABLE}"
    )
    if any(rev not in known for rev in theirs):
        raise SchemaManagedElsewhereError(
            f"{found}, newer than this version of sa_jobqueue knows ({', '.join(sorted(heads))}):"
            " upgrade the sa_jobqueue package"
        )
    raise SchemaManagedElsewhereError(
        f"{found} (your application's Alembic history): run `alembic upgrade heads` in your"
        " project instead"
    )


def upgrade(engine: Engine, revision: str = "heads") -> None:
    """Bring the database's sa_jobqueue schema up to ``revision`` (default: the newest).

    Records the revision in ``sa_jobqueue_alembic_version``. A database whose application's
    ``alembic_version`` already records our head is left as it is; one where it records an
    older or unknown revision of ours raises SchemaManagedElsewhereError, as does one whose
    tables exist with no revision of ours recorded anywhere (``metadata.create_all``).

    Not guaranteed: an application history whose version table is not named
    ``alembic_version`` is not looked for.
    """
    config = Config()
    config.set_main_option("script_location", "sa_jobqueue:migrations")
    config.set_main_option("path_separator", "space")
    config.set_main_option("version_locations", VERSION_LOCATION)
    with engine.connect() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, revision)
