"""Progress on the row: written by the fenced lease renewal, kept by a renewal without a report,
cleared by the claim of the next attempt, kept by a lost last attempt; each test rolled back.

A real worker's handler reporting progress is in tests/acceptance/test_progress.py.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from sa_jobqueue._sql import claiming, leases
from sa_jobqueue._sql.fence import held_many
from sa_jobqueue.models import jobs_table
from tests.helpers.job_states import add_job

j = jobs_table.c


def claim(conn: sa.Connection, queue: str = "progress-q") -> tuple[int, int]:
    """Claim the queue's first job; its id and attempt."""
    row = conn.execute(claiming.claim(), {"from_queue": queue, "limit": 1, "worker": "w"}).one()
    return row.id, row.attempts


def renew(conn: sa.Connection, pairs: list[tuple[int, int]], progress: dict[str, Any]) -> set[int]:
    params = {**held_many(pairs), "progress": progress}
    return {row.id for row in conn.execute(leases.extend_leases(), params)}


def progress_of(conn: sa.Connection, job_id: int) -> tuple[Any, Any, bool]:
    """``(progress, progress_message, whether progress_at is now())``."""
    row = conn.execute(
        sa.select(j.progress, j.progress_message, j.progress_at == sa.func.now()).where(
            j.id == job_id
        )
    ).one()
    return row[0], row[1], row[2]


def test_a_renewal_writes_the_reported_progress_and_one_without_keeps_it(
    conn: sa.Connection,
) -> None:
    first = add_job(conn, queue="progress-q")
    second = add_job(conn, queue="progress-q")
    a, b = claim(conn), claim(conn)
    assert progress_of(conn, first) == (None, None, None)
    report = {str(first): {"fraction": 0.25, "message": "1 of 4 files"}}
    assert renew(conn, [a, b], report) == {first, second}
    assert progress_of(conn, first) == (0.25, "1 of 4 files", True)
    assert progress_of(conn, second) == (None, None, None)  # it reported nothing
    # No report since: renewed, its progress as it was.
    assert renew(conn, [a, b], {}) == {first, second}
    assert progress_of(conn, first) == (0.25, "1 of 4 files", True)
    # A report without a message clears the last one's.
    renew(conn, [a], {str(first): {"fraction": 1.0, "message": None}})
    assert progress_of(conn, first) == (1.0, None, True)


def test_a_stale_attempt_writes_no_progress(conn: sa.Connection) -> None:
    job_id = add_job(conn, queue="progress-q")
    _, attempt = claim(conn)
    stale = {str(job_id): {"fraction": 0.9, "message": "from an attempt long gone"}}
    assert renew(conn, [(job_id, attempt - 1)], stale) == set()
    assert renew(conn, [(job_id, attempt + 1)], stale) == set()
    assert progress_of(conn, job_id) == (None, None, None)


def test_the_next_attempts_claim_clears_the_progress_and_a_lost_last_attempt_keeps_it(
    conn: sa.Connection,
) -> None:
    retried = add_job(conn, queue="progress-q", max_attempts=3)
    last = add_job(conn, queue="progress-last", max_attempts=1)
    pairs = [claim(conn), claim(conn, "progress-last")]
    renew(conn, pairs, {str(job_id): {"fraction": 0.5, "message": "half"} for job_id, _ in pairs})
    # Both leases run out (their worker died) and the claim finds them.
    conn.execute(
        sa.update(jobs_table)
        .where(j.id.in_([retried, last]))
        .values(visible_at=sa.func.now() - timedelta(seconds=1))
    )
    job_id, attempt = claim(conn)
    assert (job_id, attempt) == (retried, 2)
    assert progress_of(conn, retried) == (None, None, None)  # attempt 2 has reported nothing
    conn.execute(claiming.claim(), {"from_queue": "progress-last", "limit": 1, "worker": "w"})
    status, progress = conn.execute(sa.select(j.status, j.progress).where(j.id == last)).one()
    assert (status, progress) == ("dead", 0.5)  # its last attempt's progress, kept
