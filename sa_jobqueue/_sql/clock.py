"""Time in statements: the database's clock, and durations passed as seconds."""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import cache

from sqlalchemy import (
    ColumnElement,
    Float,
    Select,
    bindparam,
    func,
    select,
)


def seconds(param: str) -> ColumnElement[timedelta]:
    """An interval from a bind parameter holding a number of seconds.

    Durations travel as seconds, not as Python timedeltas: psycopg sends ``timedelta(days=n)``
    as an interval of n calendar days, and ``now() + '1 day'`` across a daylight-saving change
    in the session's time zone is 23 or 25 hours, not 24.
    """
    return func.make_interval(0, 0, 0, 0, 0, 0, bindparam(param, type_=Float))


@cache
def database_now() -> Select[datetime]:
    """The database's clock: the start of the current transaction."""
    return select(func.now())
