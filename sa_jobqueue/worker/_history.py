"""The history's fold: finished jobs counted per queue and hour, off the completion path."""

from __future__ import annotations

from sqlalchemy import Engine

from .._sql import history as history_sql
from .._sql import retention as retention_sql
from ..models import HISTORY_KEPT

#: Folds one round runs at most, each over at most ``history_sql.SPAN`` seconds of finishes:
#: an hour of them a round (a round runs about once a minute, in the claim loop's pauses),
#: so a worker that was away for a day catches up within half an hour, never in one long lock;
#: pruning does not wait for it meanwhile (it counts what it deletes past the mark).
FOLD_MAX_ROUNDS = 4
#: Hours of history (rows: a queue's hour) one round deletes at most once they are older than
#: HISTORY_KEPT: 10,000 queues' hours go stale an hour at a time, and a round runs a minute.
HISTORY_PRUNE_BATCH = 20_000

_WINDOW = {"lag": history_sql.LAG, "max_lag": history_sql.MAX_LAG, "span": history_sql.SPAN}


class HistoryFolder:
    """Folds the jobs that finished since the mark into the hourly history, and deletes the
    hours older than ``HISTORY_KEPT``, while holding the prune lock.

    The completion writes nothing for the history: this reads the finishes back from the
    jobs table's prune and dead indexes, a window of ``finished_at`` at a time, before
    pruning deletes them (and pruning counts the ones it deletes first: see ``_sql.history``).
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def fold(self, *, max_rounds: int = FOLD_MAX_ROUNDS) -> bool:
        """Fold up to ``max_rounds`` windows; whether the mark reached the horizon.

        Each window is its own transaction: the mark row locked, the window's counts added,
        the mark moved by compare-and-set (its row count checked). Returns False at once when
        another session holds the prune lock (it prunes or folds: the next round catches up).
        """
        for _ in range(max_rounds):
            with self._engine.begin() as conn:
                if not conn.execute(retention_sql.try_prune_lock()).scalar():
                    return False
                window = conn.execute(history_sql.fold_window(), _WINDOW).one_or_none()
                if window is None:  # the mark's row was deleted by hand: nothing to fold to
                    return True
                if window.horizon <= window.folded_to:
                    return True
                bounds = {"since": window.folded_to, "until": window.horizon}
                conn.execute(history_sql.fold(), bounds)
                if conn.execute(history_sql.advance(), bounds).rowcount != 1:
                    # Under the lock and the row's lock, only a hand-made change gets here:
                    # undo the counts rather than count the window twice.
                    conn.rollback()
                    return False
            if window.caught_up:
                return True
        return False

    def prune(self) -> int:
        """Delete up to HISTORY_PRUNE_BATCH hours older than HISTORY_KEPT; return how many."""
        params = {"kept": HISTORY_KEPT.total_seconds(), "limit": HISTORY_PRUNE_BATCH}
        with self._engine.begin() as conn:
            if not conn.execute(retention_sql.try_prune_lock()).scalar():
                return 0
            deleted: int = conn.execute(history_sql.prune_history(), params).rowcount
        return deleted
