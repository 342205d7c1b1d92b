"""Reading where the database's schema stands: tables present, revisions recorded."""

from __future__ import annotations

from functools import cache

from sqlalchemy import Select, Text, bindparam, column, func, select, table


@cache
def table_exists() -> Select[object]:
    """``to_regclass(:table)``: the table's oid if ``:table`` resolves on the search_path,
    else NULL (no error, unlike a cast to regclass)."""
    return select(func.to_regclass(bindparam("table", type_=Text)))


@cache
def recorded_revisions(version_table: str) -> Select[str]:
    """Our revisions (``sajq_*``) in Alembic version table ``version_table``, in order.

    The table is named by the caller from a fixed list, never by user input; its name is
    quoted as an identifier.
    """
    versions = table(version_table, column("version_num", Text))
    # autoescape: the underscore in the prefix is a LIKE wildcard, and would match any
    # character in its place.
    return (
        select(versions.c.version_num)
        .where(versions.c.version_num.startswith("sajq_", autoescape=True))
        .order_by(versions.c.version_num)
    )
