"""The application code examples/test_signup.py tests: a sign-up that welcomes the new user.

It reuses the models, queue and task of outbox.py: the user row and the job that sends the
welcome e-mail are written in the caller's transaction, and commit together or not at all.
"""

from __future__ import annotations

from outbox import User, queue, send_welcome
from sqlalchemy.orm import Session


def sign_up(session: Session, email: str) -> User:
    """Add a user and the job that welcomes them, in the session's transaction. Never commits."""
    user = User(email=email)
    session.add(user)
    session.flush()  # assigns user.id
    queue.enqueue(session, send_welcome, {"user_id": user.id})
    return user
