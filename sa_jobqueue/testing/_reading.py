"""What the testing helpers read through: the caller's connection, and the job fields they read.

Internal to :mod:`sa_jobqueue.testing`; may change without notice.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Final

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session, scoped_session

from .._binds import SessionLike
from ..queue import JobInfo

#: The columns read into each :class:`~sa_jobqueue.JobInfo` the helpers return.
JOB_FIELDS: Final = tuple(f.name for f in dataclasses.fields(JobInfo))


@contextlib.contextmanager
def reading(bind: Engine | SessionLike) -> Iterator[Connection]:
    """The caller's connection (in its transaction), or a fresh one from an Engine."""
    if isinstance(bind, Engine):
        with bind.connect() as conn:
            yield conn
    else:
        yield connection_of(bind)


def connection_of(session: SessionLike) -> Connection:
    """The Connection of the caller's Session or Connection; TypeError for anything else."""
    # Session.connection() joins (or begins) the session's transaction without flushing it.
    if isinstance(session, Session | scoped_session):
        return session.connection()
    if isinstance(session, Connection):
        return session
    raise TypeError(f"expected a Session or Connection, not {type(session).__name__}")
