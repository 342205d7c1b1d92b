"""An application's own tables (a declarative base of its own) and the tasks of the
sa_jobqueue.testing tests, which write notes.

Imported by the test modules of every tier (the unit tier only calls the handlers); the
integration and acceptance tiers create :data:`metadata`'s tables in their databases.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy import select
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sa_jobqueue import Backoff, JobContext, JobQueue


class AppBase(DeclarativeBase):
    """The application's declarative base, unrelated to sa_jobqueue's."""


class Order(AppBase):
    __tablename__ = "app_orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    note: Mapped[str]


class Invoice(AppBase):
    __tablename__ = "app_invoices"

    id: Mapped[int] = mapped_column(primary_key=True)
    note: Mapped[str]


class Note(AppBase):
    __tablename__ = "testing_notes"

    id: Mapped[int] = mapped_column(primary_key=True)
    text: Mapped[str]


queue = JobQueue()


@queue.task
def write_note(ctx: JobContext, payload: dict[str, str]) -> str:
    ctx.session.add(Note(text=payload["text"]))
    return f"wrote {payload['text']}"


@queue.task(queue="emails", max_attempts=3)
def describe(ctx: JobContext, payload: Any) -> dict[str, Any]:
    return {
        "job_id": ctx.job_id,
        "task": ctx.task,
        "queue": ctx.queue,
        "attempt": ctx.attempt,
        "max_attempts": ctx.max_attempts,
        "payload": payload,
    }


@queue.task
async def describe_async(ctx: JobContext, payload: Any) -> str:
    return f"async {payload} attempt {ctx.attempt}"


@queue.task(max_attempts=3, backoff=Backoff(base=timedelta(hours=1), cap=timedelta(hours=2)))
def write_then_fail(ctx: JobContext, payload: Any) -> None:
    ctx.session.add(Note(text="from a failing attempt"))
    ctx.session.flush()
    raise RuntimeError(f"boom {ctx.attempt}")


@queue.task
def committing(ctx: JobContext, payload: Any) -> None:
    ctx.session.add(Note(text="committed by the handler?"))
    ctx.session.commit()


@queue.task
def chain(ctx: JobContext, payload: dict[str, int]) -> None:
    """Write a note and enqueue the next link, ``left`` times (forever if ``left`` < 0)."""
    ctx.session.add(Note(text=f"link {payload['left']}"))
    if payload["left"] != 0:
        queue.enqueue(ctx.session, chain, {"left": payload["left"] - 1})


@queue.periodic("* * * * *")
@queue.task
def every_minute(ctx: JobContext, payload: Any) -> None:
    pass


metadata = AppBase.metadata


def notes(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(select(Note.text).order_by(Note.id)).scalars())
