"""The migrations tier: our Alembic branch, the ``migrate`` command, and a user's own history.

Each test has fresh databases of its own (the root conftest clones them): one without our
schema (``empty_engine``) or one migrated to our newest revision (``migrated_engine``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL

from sa_jobqueue.database import create_engine


@pytest.fixture
def empty_engine(empty_database_url: URL) -> Iterator[sa.Engine]:
    """An engine on a fresh database without our schema."""
    engine = create_engine(empty_database_url, poolclass=sa.pool.NullPool)
    yield engine
    engine.dispose()


@pytest.fixture
def migrated_engine(database_url: URL) -> Iterator[sa.Engine]:
    """An engine on a fresh database migrated to our newest revision."""
    engine = create_engine(database_url, poolclass=sa.pool.NullPool)
    yield engine
    engine.dispose()
