"""``sa-jobqueue migrate``: create or upgrade the sa_jobqueue tables."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from sqlalchemy import Engine

from ..database import create_engine, ping, recorded


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    database_option: Callable[[argparse.ArgumentParser], None],
) -> None:
    """Declare ``sa-jobqueue migrate``: no option but the database's."""
    migrate_ = commands.add_parser("migrate", help="create or upgrade the sa_jobqueue tables")
    database_option(migrate_)


def migrate(args: argparse.Namespace) -> int:
    """Upgrade the database to our newest revision; 0 once it is there.

    Prints one line saying what it did: created the tables, upgraded them from one revision to
    another, or nothing (and where the revision is recorded, when an application's Alembic
    history holds it). Alembic is imported only for this command: the others never need it.
    """
    from ..migrations import APPLICATION_VERSION_TABLE, VERSION_TABLE, upgrade

    engine = create_engine(args.database_url, pooler=args.pooler)
    ping(engine)
    before = _revision(engine, VERSION_TABLE)
    upgrade(engine)
    after = _revision(engine, VERSION_TABLE)
    if after is None:  # left alone: an application's history holds our schema at our head
        theirs = _revision(engine, APPLICATION_VERSION_TABLE)
        print(
            f"sa-jobqueue: schema is up to date (revision {theirs}, recorded in"
            f" {APPLICATION_VERSION_TABLE}); nothing to do"
        )
    elif before is None:
        print(f"sa-jobqueue: created the sa_jobqueue tables at revision {after}")
    elif before != after:
        print(f"sa-jobqueue: upgraded the sa_jobqueue schema from {before} to {after}")
    else:
        print(f"sa-jobqueue: schema is up to date (revision {after}); nothing to do")
    return 0


def _revision(engine: Engine, table: str) -> str | None:
    """Our newest revision recorded in the version table ``table``; None if there is none."""
    with engine.connect() as conn:
        revisions = recorded(conn, table)
    return max(revisions) if revisions else None
