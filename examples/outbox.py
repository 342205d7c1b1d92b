"""The transactional outbox: a business row and the job about it commit together, or not at all.

python examples/outbox.py        # uses DATABASE_URL, else an embedded PostgreSQL server
"""

from __future__ import annotations

from _database import database_url
from sqlalchemy import ForeignKey, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sa_jobqueue import JobContext, JobQueue, Worker
from sa_jobqueue.database import create_engine
from sa_jobqueue.migrations import upgrade


class Base(DeclarativeBase):
    pass


class User(Base):
    __tablename__ = "outbox_users"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str]


class WelcomeEmail(Base):
    __tablename__ = "outbox_welcome_emails"

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey(User.id))
    subject: Mapped[str]


queue = JobQueue()


@queue.task(max_attempts=3)
def send_welcome(ctx: JobContext, payload: dict[str, int]) -> None:
    user = ctx.session.get_one(User, payload["user_id"])
    # A real handler would call a mail API here; that may happen more than once (execution is
    # at-least-once). The row below commits exactly once, with the job's completion.
    ctx.session.add(WelcomeEmail(user_id=user.id, subject=f"Welcome, {user.email}"))


def main() -> None:
    with database_url("sajq_outbox") as url:
        engine = create_engine(url)
        try:
            upgrade(engine)  # sa_jobqueue's table, as `sa-jobqueue migrate` would
            Base.metadata.create_all(engine)  # the application's own tables

            with Session(engine) as session, session.begin():
                user = User(email="ada@example.com")
                session.add(user)
                session.flush()  # assigns user.id
                user_id = user.id
                job_id = queue.enqueue(session, send_welcome, {"user_id": user_id})
            # Committed: the user and the job exist together. Had the block raised, neither would.

            # Burst mode: run every job that is due, then return. No LISTEN needed for that.
            Worker(queue, engine, concurrency=2, listen=False).run(burst=True)

            with Session(engine) as session:
                job = queue.get_job(session, job_id)
                email = session.scalars(select(WelcomeEmail).filter_by(user_id=user_id)).one()
            assert job is not None
            print(f"job {job.id} ({job.task}): {job.status} after {job.attempts} attempt(s)")
            print(f"welcome email row {email.id} for user {user_id}: {email.subject!r}")
        finally:
            engine.dispose()


if __name__ == "__main__":
    main()
