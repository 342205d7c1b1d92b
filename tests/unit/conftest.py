"""The unit tier: tests that need no database at all, and so start none.

A unit test that asks for a database fixture fails at once, before any server is started: it
belongs in tests/integration (rolled back) or tests/acceptance (a database of its own).
"""

from __future__ import annotations

import pytest

#: Every database fixture depends on this one.
_SERVER = "server_url"


@pytest.fixture(autouse=True)
def _no_database(request: pytest.FixtureRequest) -> None:
    if _SERVER in request.fixturenames:
        pytest.fail(f"{request.node.nodeid} asks for a database: it is not a unit test")
