"""Every statement is built in ``sa_jobqueue/_sql/``: no module elsewhere constructs SQL.

The scan parses each module of the package (no import, no database) and reports calls that
build a statement: SQLAlchemy's ``select``/``update``/``delete``/``insert``/``text`` and schema
DDL, ``exec_driver_sql``, psycopg's ``sql.SQL`` composition, and a driver ``execute`` of a
literal SQL string. Builders in ``_sql`` are pure functions; modules elsewhere run them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "sa_jobqueue"

#: SQLAlchemy callables that build a statement (or DDL), by their last name.
SQLALCHEMY_BUILDERS = frozenset(
    {"select", "update", "delete", "insert", "text", "CreateSchema", "DropSchema"}
)

#: Places that build SQL outside ``_sql`` for good, each with the reason. (path, kind)
ALLOWED: dict[tuple[str, str], str] = {
    # Column defaults and partial-index predicates of the table definitions: schema, not
    # statements; Alembic's autogenerate compares them with the migrations.
    ("models.py", "sqlalchemy.text"): "DDL fragments of the table definitions",
    # The pooler support runs below SQLAlchemy, in connection events: a driver-level simple
    # query with no parameters ("BEGIN; SELECT set_config(...)", COMMIT, ROLLBACK, in
    # _pooler.py, and the engines' checkout ping ";", in database.py) composed with
    # psycopg's quoting. They are session plumbing around our statements, not statements of
    # the queue, and must not pass through SQLAlchemy's execution (which would fire the same
    # events again).
    ("_pooler.py", "psycopg.sql"): "session settings behind a transaction pooler",
    ("_pooler.py", "driver execute"): "BEGIN/COMMIT/ROLLBACK around the pooler's settings",
    ("database.py", "driver execute"): "the engines' checkout ping",
    # A group's savepoints are composed in _sql/session.py; the first of each transaction is
    # sent through SQLAlchemy's execution (so the engine's events begin the transaction as
    # they must) without its compiler, which would compile each freshly named one anew.
    ("worker/_sessions.py", "exec_driver_sql"): "a group transaction's first savepoint",
    # The held connection sends a statement built in _sql as the text SQLAlchemy compiled
    # for it (once), through SQLAlchemy's execution, so its events still fire.
    ("database.py", "exec_driver_sql"): "a held connection's statement sent as its text",
    # The listener holds a raw psycopg connection in autocommit for its notifications
    # generator: LISTEN on the constant channel (quoted as an identifier by psycopg) and the
    # keep-alive SELECT 1 after a silence are driver calls on that connection, not statements
    # of the queue.
    ("worker/_listener.py", "psycopg.sql"): "LISTEN on the wake-up channel",
    ("worker/_listener.py", "driver execute"): "the listener connection's keep-alive",
}


def _skipped(path: Path) -> bool:
    relative = path.relative_to(PACKAGE).parts
    # _sql is the home. Alembic revisions are frozen history: a revision must keep running
    # exactly what it ran when it was written, so it never imports the live builders.
    return relative[0] == "_sql" or relative[:2] == ("migrations", "versions")


def _imported_names(tree: ast.Module) -> dict[str, str]:
    """Local name -> dotted name of what it refers to, from the module's imports."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _dotted(node: ast.expr, names: dict[str, str]) -> str | None:
    """``sa.schema.CreateSchema`` -> ``sqlalchemy.schema.CreateSchema``, via the imports."""
    attrs: list[str] = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in names:
        return None
    return ".".join([names[node.id], *reversed(attrs)])


def _kind(call: ast.Call, names: dict[str, str]) -> str | None:
    """What kind of SQL-building call this is, or None."""
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr == "exec_driver_sql":
        return "exec_driver_sql"
    if (
        isinstance(func, ast.Attribute)
        and func.attr == "execute"
        and call.args
        and isinstance(call.args[0], ast.Constant)
        and isinstance(call.args[0].value, str | bytes)
    ):
        return "driver execute"
    dotted = _dotted(func, names)
    if dotted is None:
        return None
    if dotted.startswith("sqlalchemy") and dotted.rsplit(".", 1)[-1] in SQLALCHEMY_BUILDERS:
        return "sqlalchemy." + dotted.rsplit(".", 1)[-1]
    if dotted.startswith("psycopg.sql."):
        return "psycopg.sql"
    return None


def _findings() -> Iterator[tuple[str, str, int]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        if _skipped(path):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        names = _imported_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and (kind := _kind(node, names)) is not None:
                yield path.relative_to(PACKAGE).as_posix(), kind, node.lineno


def test_statements_are_built_only_in_sql() -> None:
    allowed = ALLOWED.keys()
    stray = [
        f"sa_jobqueue/{path}:{line}: {kind}"
        for path, kind, line in _findings()
        if (path, kind) not in allowed
    ]
    assert not stray, (
        "statements built outside sa_jobqueue/_sql (add a builder there and call it):\n"
        + "\n".join(stray)
    )


def test_the_allow_lists_hold_nothing_unneeded() -> None:
    found = {(path, kind) for path, kind, _ in _findings()}
    unneeded = sorted((ALLOWED.keys()) - found)
    assert not unneeded, f"allow-list entries that match nothing any more; remove: {unneeded}"


@pytest.mark.parametrize(
    ("source", "kind"),
    [
        ("from sqlalchemy import select\nselect(1)", "sqlalchemy.select"),
        ("import sqlalchemy as sa\nsa.select(sa.func.now())", "sqlalchemy.select"),
        ("from sqlalchemy.dialects.postgresql import insert as i\ni(t)", "sqlalchemy.insert"),
        ("import sqlalchemy as sa\nsa.schema.DropSchema('x')", "sqlalchemy.DropSchema"),
        ("from sqlalchemy import text\ntext('SELECT 1')", "sqlalchemy.text"),
        ("conn.exec_driver_sql('SELECT 1')", "exec_driver_sql"),
        ("raw.execute(b'COMMIT')", "driver execute"),
        ("from psycopg import sql\nsql.SQL('LISTEN {}')", "psycopg.sql"),
        ("conn.execute(statement, params)", None),
        ("from ._sql import admin\nadmin.select_jobs()", None),
    ],
)
def test_the_scan_recognises_statement_builders(source: str, kind: str | None) -> None:
    tree = ast.parse(source)
    names = _imported_names(tree)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    kinds = {_kind(call, names) for call in calls} - {None}
    assert kinds == ({kind} if kind else set())


def test_every_bound_id_or_attempt_array_takes_the_one_explicit_type() -> None:
    """An ``ARRAY(BigInteger)``/``ARRAY(Integer)`` bind of its own would let psycopg size the
    array by one ``Enqueued`` element (see ``_sql/arrays.py``): they all go through it."""
    bare = [
        f"{path.name}:{n}"
        for path in sorted((PACKAGE / "_sql").glob("*.py"))
        if path.name != "arrays.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "bindparam(" in line and ("ARRAY(BigInteger)" in line or "ARRAY(Integer)" in line)
    ]
    assert bare == []
