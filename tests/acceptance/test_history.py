"""The hourly history: every finish counted once, by the fold or by the prune, and kept a week.

Finished jobs are written straight into the table with a chosen ``finished_at`` (what the
fold reads), and the mark moved back over them: a worker's outcome writes the same columns.
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta

import pytest
import sqlalchemy as sa

from sa_jobqueue import JobQueue, Worker
from sa_jobqueue.models import history_mark_table, history_table
from sa_jobqueue.worker import _history
from sa_jobqueue.worker._history import HistoryFolder

FINISHED = sa.text(
    "INSERT INTO sa_jobqueue_jobs (queue, task, payload, status, attempts, finished_at)"
    " SELECT :queue, 'app.task', '{}', :status, 1, now() - make_interval(secs => :ago)"
    " FROM generate_series(1, :n)"
)


def finish(engine: sa.Engine, queue: str, status: str, n: int, ago: timedelta) -> None:
    """``n`` jobs of ``queue`` that ended ``status`` ``ago`` (database clock)."""
    with engine.begin() as conn:
        params = {"queue": queue, "status": status, "n": n, "ago": ago.total_seconds()}
        conn.execute(FINISHED, params)


def mark_back(engine: sa.Engine, by: timedelta) -> None:
    """Fold from ``by`` ago: as if the history had been there since then."""
    with engine.begin() as conn:
        back = sa.func.now() - sa.text("make_interval(secs => :by)").bindparams(
            by=by.total_seconds()
        )
        conn.execute(sa.update(history_mark_table).values(folded_to=back))


def counted(engine: sa.Engine) -> Counter[tuple[str, str]]:
    """The history's totals per (queue, status), every hour together."""
    h = history_table.c
    totals: Counter[tuple[str, str]] = Counter()
    with engine.connect() as conn:
        for row in conn.execute(sa.select(h.queue, h.succeeded, h.dead, h.cancelled)):
            for status in ("succeeded", "dead", "cancelled"):
                totals[(row.queue, status)] += getattr(row, status)
    return +totals


def test_each_finish_is_counted_once_by_the_fold_or_by_the_prune(
    db: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    mark_back(db, timedelta(hours=3))
    finish(db, "a", "succeeded", 5, timedelta(hours=2))
    finish(db, "a", "dead", 2, timedelta(hours=2))
    finish(db, "a", "cancelled", 1, timedelta(minutes=150))
    finish(db, "b", "succeeded", 3, timedelta(minutes=90))
    expected = Counter(
        {("a", "succeeded"): 5, ("a", "dead"): 2, ("a", "cancelled"): 1, ("b", "succeeded"): 3}
    )
    folder = HistoryFolder(db)
    assert not folder.fold()  # three hours, a quarter of an hour a window, four a round
    assert folder.fold(max_rounds=12)
    assert counted(db) == expected
    assert folder.fold()
    assert counted(db) == expected  # folded again: nothing counted twice
    # Pruning deletes the succeeded and cancelled jobs: their counts stay.
    assert Worker(JobQueue(), db, retention=timedelta(hours=1)).prune() == 9
    assert counted(db) == expected
    # Jobs that finished a moment ago lie past the fold's horizon; pruned at once (retention
    # 0), the prune counts them as it deletes them ...
    finish(db, "a", "succeeded", 4, timedelta(0))
    finish(db, "c", "cancelled", 2, timedelta(0))
    assert Worker(JobQueue(), db, retention=timedelta(0)).prune() == 6
    expected.update({("a", "succeeded"): 4, ("c", "cancelled"): 2})
    assert counted(db) == expected
    # ... and a fold over their moment (no lag) finds them gone: counted once.
    monkeypatch.setitem(_history._WINDOW, "lag", 0.0)
    assert folder.fold()
    assert counted(db) == expected


def test_folds_at_once_count_each_finish_once(db: sa.Engine) -> None:
    mark_back(db, timedelta(hours=12))
    for hours in range(1, 12):
        finish(db, "a", "succeeded", hours, timedelta(hours=hours, minutes=1))
    expected = Counter({("a", "succeeded"): sum(range(1, 12))})
    start = threading.Barrier(4)

    def fold() -> None:
        start.wait()
        for _ in range(20):
            HistoryFolder(db).fold(max_rounds=1)

    threads = [threading.Thread(target=fold) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert HistoryFolder(db).fold(max_rounds=60)
    assert counted(db) == expected


def test_an_open_transaction_holds_the_horizon_back(
    db: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No lag: only the open transaction keeps the fold from passing the late finish's stamp.
    monkeypatch.setitem(_history._WINDOW, "lag", 0.0)
    folder = HistoryFolder(db)
    with db.connect() as late:
        late.begin()
        # It finishes a job, stamped with its transaction's start, and commits after a fold:
        # a horizon past the stamp would leave this finish behind the mark, never counted.
        late.execute(FINISHED, {"queue": "late", "status": "succeeded", "n": 1, "ago": 0.0})
        finish(db, "a", "succeeded", 1, timedelta(0))
        assert folder.fold()
        late.commit()
    assert folder.fold()
    assert counted(db) == Counter({("late", "succeeded"): 1, ("a", "succeeded"): 1})


def test_hours_older_than_a_week_and_a_day_are_deleted(db: sa.Engine) -> None:
    with db.begin() as conn:
        for days in (6, 9):
            conn.execute(
                sa.insert(history_table).values(
                    queue=f"q{days}",
                    hour=sa.func.date_trunc("hour", sa.func.now())
                    - sa.text("make_interval(days => :days)").bindparams(days=days),
                    succeeded=1,
                )
            )
    assert HistoryFolder(db).prune() == 1
    assert counted(db) == Counter({("q6", "succeeded"): 1})
