"""Arrays of job ids and attempts, bound with one explicit type wherever they are bound.

psycopg types a list parameter by looking at its elements, and for an ``int`` subclass (the
``Enqueued`` ids that ``enqueue`` returns) by one element's size: a list of ids on both sides
of 32767/32768 was sent as ``smallint[]`` (and across 2^31 as ``integer[]``), and PostgreSQL
refused the larger one before any ``::BIGINT[]`` cast could apply. Every value is made a plain
``int`` here, so psycopg sizes the array by its largest element, and the statement casts it to
the column's type. Every id array (and attempts or process-id array) of ``_sql`` is built here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import BigInteger, BindParameter, Integer, TypeDecorator, bindparam
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Dialect


class _IntArray(TypeDecorator[list[int]]):
    """An array of integers whose elements are bound as plain ``int``."""

    impl = ARRAY(BigInteger)
    cache_ok = True

    def process_bind_param(self, value: Iterable[int] | None, dialect: Dialect) -> Any:
        return None if value is None else [int(v) for v in value]


class _IdArray(_IntArray):
    """``bigint[]``: job ids (the jobs table's ``id`` is a bigint)."""

    impl = ARRAY(BigInteger)
    cache_ok = True


class _AttemptArray(_IntArray):
    """``integer[]``: attempt numbers (the jobs table's ``attempts`` is an integer)."""

    impl = ARRAY(Integer)
    cache_ok = True


#: The types, for columns of derived tables that carry such arrays.
ID_ARRAY = _IdArray()
ATTEMPT_ARRAY = _AttemptArray()


def id_array(name: str) -> BindParameter[list[int]]:
    """A bind parameter ``:name`` holding job ids, sent as ``bigint[]``."""
    return bindparam(name, type_=ID_ARRAY)


def attempt_array(name: str) -> BindParameter[list[int]]:
    """A bind parameter ``:name`` holding attempt numbers, sent as ``integer[]``."""
    return bindparam(name, type_=ATTEMPT_ARRAY)


def pid_array(name: str) -> BindParameter[list[int]]:
    """A bind parameter ``:name`` holding server process ids, sent as ``integer[]``."""
    return bindparam(name, type_=ATTEMPT_ARRAY)
