"""Bulk operations (``ops.bulk``) and ``ops.requeue_dead_jobs``, with what each promises.

Each call runs in the checker's transaction, beside the workers and the faults. A trigger
of the checker's own (``mc_bulk``) logs every row the transaction changes or deletes in the
jobs table, before and after: it logs only in a transaction that set ``mc.step`` (the
checker's bulk calls), so the workers' statements pass through it untouched. Right after the
call, in the same transaction, :func:`judge` holds the log against what the docstrings
promise, and the model learns what changed:

- every row changed is one the call chose (a named id, or one matching the filters) in a
  status its action applies to (``bulk.APPLIES_TO``; by filter, cancel reaches no waiting
  job), and changed the way the action says: cancel ends a waiting or queued job
  ``cancelled`` and requests cancellation of a running one (its worker ends it; one whose
  cancellation was already requested is requested again, and counted); retry and
  ``requeue_dead_jobs`` queue a dead job again, its attempts kept and ``max_attempts``
  raised by its value; delete removes finished jobs only; run-now makes a queued job due
  later due now. The only other rows a cancel may change are the dependents it settles
  (waiting, then queued or cancelled);
- the counts the call returned are those rows (``done``, ``requested``, ``requeued``), and
  no more jobs than ``batch`` were changed.

What the model learns: cancelled and cancel-requested jobs must end cancelled
(``cancel_honoured``), requeued ones are left out of ``dependency_order`` as a requeue is,
deleted ones are gone for good (``nothing_lost`` leaves them out).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from sa_jobqueue._validation import MAX_ATTEMPTS
from sa_jobqueue.models import FINISHED_STATUSES, jobs_table
from sa_jobqueue.ops import requeue_dead_jobs
from sa_jobqueue.ops.bulk import cancel_jobs, delete_jobs, retry_jobs, run_jobs_now
from tests.model.model import Model, Violation
from tests.model.schedule import Step
from tests.model.tasks import metadata

j = jobs_table.c

log = sa.Table(
    "mc_bulk",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("step", sa.Integer, nullable=False),
    sa.Column("op", sa.Text, nullable=False),  # UPDATE or DELETE
    sa.Column("job_id", sa.BigInteger, nullable=False),
    sa.Column("queue", sa.Text),
    sa.Column("task", sa.Text),
    sa.Column("created_at", sa.DateTime(timezone=True)),
    sa.Column("old_status", sa.Text),
    sa.Column("new_status", sa.Text),
    sa.Column("old_requested", sa.Boolean),
    sa.Column("new_requested", sa.Boolean),
    sa.Column("old_visible", sa.DateTime(timezone=True)),
    sa.Column("new_visible", sa.DateTime(timezone=True)),
    sa.Column("old_attempts", sa.Integer),
    sa.Column("new_attempts", sa.Integer),
    sa.Column("old_max", sa.Integer),
    sa.Column("new_max", sa.Integer),
)

_FUNCTION = """
CREATE OR REPLACE FUNCTION mc_bulk_log() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF coalesce(current_setting('mc.step', true), '') = '' THEN
    RETURN NULL;
  END IF;
  IF TG_OP = 'DELETE' THEN
    INSERT INTO mc_bulk (step, op, job_id, queue, task, created_at, old_status,
                         old_requested, old_visible, old_attempts, old_max)
    VALUES (current_setting('mc.step')::int, TG_OP, OLD.id, OLD.queue, OLD.task,
            OLD.created_at, OLD.status, OLD.cancel_requested, OLD.visible_at, OLD.attempts,
            OLD.max_attempts);
  ELSE
    INSERT INTO mc_bulk (step, op, job_id, queue, task, created_at, old_status, new_status,
                         old_requested, new_requested, old_visible, new_visible,
                         old_attempts, new_attempts, old_max, new_max)
    VALUES (current_setting('mc.step')::int, TG_OP, OLD.id, OLD.queue, OLD.task,
            OLD.created_at, OLD.status, NEW.status, OLD.cancel_requested,
            NEW.cancel_requested, OLD.visible_at, NEW.visible_at, OLD.attempts, NEW.attempts,
            OLD.max_attempts, NEW.max_attempts);
  END IF;
  RETURN NULL;
END $$
"""


def install(engine: sa.Engine) -> None:
    """The logging trigger on the seed's jobs table (after ``metadata.create_all``)."""
    with engine.begin() as conn:
        conn.execute(sa.text(_FUNCTION))
        conn.execute(
            sa.text(
                f"CREATE TRIGGER mc_bulk_log AFTER UPDATE OR DELETE ON {jobs_table.name}"
                " FOR EACH ROW EXECUTE FUNCTION mc_bulk_log()"
            )
        )


#: The statuses each action promises to change, by ids (as the docstrings say, written out
#: here rather than read from ``bulk.APPLIES_TO``: the model states the promise itself).
BY_IDS: dict[str, tuple[str, ...]] = {
    "cancel": ("waiting", "queued", "running"),
    "retry": ("dead",),
    "delete": ("succeeded", "dead", "cancelled"),
    "run_now": ("queued",),
    "requeue_dead": ("dead",),
}
#: By filter, cancel reaches queued and running jobs only.
BY_FILTER = {**BY_IDS, "cancel": ("queued", "running")}
CALLS = {
    "cancel": cancel_jobs,
    "retry": retry_jobs,
    "delete": delete_jobs,
    "run_now": run_jobs_now,
}


class Bulk:
    """The ``bulk`` and ``requeue_dead`` operations."""

    engine: sa.Engine
    model: Model

    def _ids(self, picks: list[int], action: str) -> list[int]:
        """The jobs ``picks`` names among the 40 newest: two in three among those in a status
        the action applies to (as read now: it may change before the call), the others among
        all of them."""
        recent = [i for i in self.model.order() if not self.model.jobs[i].deleted][-40:]
        with self.engine.connect() as conn:
            apt = list(
                conn.execute(
                    sa.select(j.id)
                    .where(j.id.in_(recent), j.status.in_(BY_IDS[action]))
                    .order_by(j.id)
                ).scalars()
            )
        chosen = set()
        for p in picks:
            among = apt if p % 3 and apt else recent
            if among:
                chosen.add(among[p // 3 % len(among)])
        return sorted(chosen)

    def op_bulk(self, step: Step) -> str:
        return self._bulk(step)

    def op_requeue_dead(self, step: Step) -> str:
        return self._bulk(step)

    def _bulk(self, step: Step) -> str:
        args = step.args
        action: str = args["action"]
        ids = self._ids(args["picks"], action) if "picks" in args else None
        if ids == []:
            return "no job"
        filters: dict[str, Any] = {
            k: args[k] for k in ("queue", "task", "statuses") if k in args and ids is None
        }
        if "older_than_ms" in args and ids is None:
            filters["older_than"] = timedelta(milliseconds=args["older_than_ms"])
        with Session(self.engine) as session, session.begin():
            session.execute(sa.select(sa.func.set_config("mc.step", str(step.index), True)))
            if action == "requeue_dead":
                batch = requeue_dead_jobs(session, batch=args["batch"], **filters)
                counts = {"done": batch.requeued, "requested": 0, "kept": batch.kept}
            else:
                one = CALLS[action](session, ids=ids, batch=args["batch"], **filters)
                counts = {"done": one.done, "requested": one.requested, "left": one.left}
            rows = session.execute(sa.select(log).where(log.c.step == step.index)).all()
            now = session.execute(sa.select(sa.func.now())).scalar_one()
        found, changed = judge(action, ids, filters, args["batch"], counts, rows, now)
        self.model.found += [
            Violation("bulk_effect", tuple(r.job_id for r in rows), f"step {step.index}: {v}")
            for v in found
        ]
        for job_id, what in changed:
            record = self.model.jobs.get(job_id)
            if record is None:
                continue
            if what == "cancelled":
                record.cancelled_by_checker = True
            elif what == "requeued":
                record.requeued += 1
            elif what == "deleted":
                record.deleted = True
        chosen = "ids " + str(ids) if ids is not None else f"filters {filters}"
        return f"{action} by {chosen}: {counts}, {len(rows)} rows changed"


def judge(
    action: str,
    ids: list[int] | None,
    filters: dict[str, Any],
    batch: int,
    counts: dict[str, int],
    rows: list[Any],
    now: datetime,
) -> tuple[list[str], list[tuple[int, str]]]:
    """What a bulk call's logged rows break of its promise, and what each row did."""
    applies = (BY_IDS if ids is not None else BY_FILTER)[action]
    if "statuses" in filters:
        applies = tuple(s for s in applies if s in filters["statuses"])

    def chosen(r: Any) -> bool:
        if ids is not None:
            return r.job_id in ids
        older = filters.get("older_than")
        return (
            filters.get("queue", r.queue) == r.queue
            and filters.get("task", r.task) == r.task
            and (older is None or r.created_at < now - older)
        )

    found: list[str] = []
    changed: list[tuple[int, str]] = []
    tally = {"cancelled": 0, "waiting_cancelled": 0, "requested": 0, "done": 0}
    for r in rows:
        what = _kind(action, r, now)
        settle = action == "cancel" and r.old_status == "waiting" and r.op == "UPDATE"
        if what is None or not chosen(r) or r.old_status not in applies:
            if settle and r.new_status in ("queued", "cancelled", "waiting"):
                continue  # a dependent the cancel settled
            found.append(
                f"{action} changed job {r.job_id} ({r.queue}/{r.task}, created {r.created_at})"
                f" from {_row(r, 'old')} to {_row(r, 'new')}: not a change it promises"
                f" (chosen: {chosen(r)}, applies to {applies})"
            )
            continue
        if what == "cancelled" and r.old_status == "waiting":
            tally["waiting_cancelled"] += 1
        elif what in ("cancelled", "requested"):
            tally[what] += 1
        else:
            tally["done"] += 1
        changed.append((r.job_id, "cancelled" if what == "requested" else what))
    if action == "cancel":
        low, high = tally["cancelled"], tally["cancelled"] + tally["waiting_cancelled"]
        if not low <= counts["done"] <= high or counts["requested"] != tally["requested"]:
            found.append(f"cancel said {counts}, its rows: {tally}")
        if tally["cancelled"] + tally["requested"] > batch + tally["waiting_cancelled"]:
            found.append(f"cancel changed {tally} jobs, over its batch of {batch}")
    else:
        if counts["done"] != tally["done"]:
            found.append(f"{action} said {counts}, yet changed {tally['done']} jobs so")
        if tally["done"] > batch:
            found.append(f"{action} changed {tally['done']} jobs, over its batch of {batch}")
    if ids is not None and "left" in counts:
        named = counts["done"] + counts["requested"] + counts["left"]
        if named != len(ids):
            found.append(f"{action} of {len(ids)} ids counted {counts}")
    return found, changed


def _row(r: Any, which: str) -> str:
    if which == "new" and r.op == "DELETE":
        return "deleted"
    get = lambda name: getattr(r, f"{which}_{name}")  # noqa: E731
    return (
        f"{get('status')} requested={get('requested')} visible={get('visible')}"
        f" attempts={get('attempts')}/{get('max')}"
    )


def _kind(action: str, r: Any, now: datetime) -> str | None:
    """What the logged change ``r`` is for ``action``, if it is one it promises."""
    if action == "delete":
        return "deleted" if r.op == "DELETE" and r.old_status in FINISHED_STATUSES else None
    if r.op != "UPDATE":
        return None
    if action == "cancel":
        if r.old_status in ("waiting", "queued") and r.new_status == "cancelled":
            return "cancelled"
        # Requested again if it already was: as cancel_job, which says True for any running
        # job, and counted in ``requested`` all the same.
        if (
            r.old_status == r.new_status == "running"
            and r.new_requested
            and r.old_attempts == r.new_attempts
        ):
            return "requested"
        return None
    if action in ("retry", "requeue_dead"):
        extended = min(r.old_attempts + r.old_max, MAX_ATTEMPTS)
        ok = (
            r.old_status == "dead"
            and r.new_status == "queued"
            and r.new_attempts == r.old_attempts
            and r.new_max == extended
            and not r.new_requested
        )
        return "requeued" if ok else None
    if action == "run_now":
        ok = (
            r.old_status == r.new_status == "queued"
            and r.old_visible > now
            and r.new_visible == now
            and r.old_attempts == r.new_attempts
        )
        return "ran_now" if ok else None
    return None
