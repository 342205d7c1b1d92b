"""``sa-jobqueue migrate``: create or upgrade the sa_jobqueue tables."""

from __future__ import annotations

import argparse

from ..database import create_engine, ping


def migrate(args: argparse.Namespace) -> int:
    """Upgrade the database to our newest revision; 0 once it is there.

    Alembic is imported only for this command: the others never need it.
    """
    from ..migrations import upgrade

    engine = create_engine(args.database_url, pooler=args.pooler)
    ping(engine)
    upgrade(engine)
    print("sa-jobqueue: schema is up to date")
    return 0
