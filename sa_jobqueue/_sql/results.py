"""Reading stored results, and the LISTEN a wait for them holds."""

from __future__ import annotations

from functools import cache
from typing import Any

from psycopg import sql
from sqlalchemy import Select, select

from ..models import jobs_table
from .arrays import id_array
from .transitions import RESULTS_CHANNEL

j = jobs_table.c


@cache
def outcomes() -> Select[Any]:
    """Each job of ``:job_ids`` (a primary-key probe each): its status, result, last error."""
    return select(j.id, j.status, j.result, j.last_error).where(j.id == id_array("job_ids").any_())


def listen() -> sql.Composed:
    """``LISTEN`` on :data:`~sa_jobqueue._sql.transitions.RESULTS_CHANNEL`, quoted by psycopg."""
    return sql.SQL("LISTEN {}").format(sql.Identifier(RESULTS_CHANNEL))


def unlisten() -> sql.Composed:
    """The ``UNLISTEN`` that gives a waiting connection back to its pool as it was."""
    return sql.SQL("UNLISTEN {}").format(sql.Identifier(RESULTS_CHANNEL))
