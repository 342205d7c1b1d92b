"""Recognising the errors psycopg's prepared statements meet behind a transaction pooler."""

from __future__ import annotations

import psycopg.errors
from sqlalchemy.exc import OperationalError, ProgrammingError

from sa_jobqueue._pooler import prepared_statement_clash


def test_the_clashes_of_prepared_statements_are_recognised() -> None:
    missing = psycopg.errors.InvalidSqlStatementName('prepared statement "_pg3_0" does not exist')
    there = psycopg.errors.DuplicatePreparedStatement('prepared statement "_pg3_0" already exists')
    other = psycopg.errors.ProtocolViolation(
        'bind message supplies 7 parameters, but prepared statement "_pg3_1" requires 3'
    )
    for error in (missing, there, other):
        assert prepared_statement_clash(error)
        assert prepared_statement_clash(ProgrammingError("SELECT", {}, error))


def test_other_errors_are_not() -> None:
    assert not prepared_statement_clash(OperationalError("SELECT", {}, Exception("gone")))
    assert not prepared_statement_clash(psycopg.errors.ProtocolViolation("invalid frontend"))
    assert not prepared_statement_clash(ValueError("prepared statement"))
