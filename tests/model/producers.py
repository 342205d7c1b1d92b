"""Enqueues through an Engine, and typed payloads that do not fit: what each must do.

An enqueue through an Engine runs in a transaction of its own, tried again (up to 3 times in
all) when it failed on a transient error (``sa_jobqueue._enqueue.transactions``). The
checker's producer engine reaches the database the way the workers do, as their role or
through their PgBouncer (never through the fault proxy: a silent connection would hold a
client for good), and is named like them (``sa_jobqueue``), so ``terminate``,
``conn_limit`` and ``bouncer_restart`` hit its pooled connections; it does not ping them at
checkout, so a lost one fails the enqueue's first try and the retry runs. An enqueue that
raised after its tries is *uncertain* (its COMMIT may have gone through with its reply
lost); :func:`adopt` settles, at quiescence, what each engine enqueue left in the table.

``typed`` jobs (a TypedDict payload, ``tasks.TypedPlan``): an invalid payload must raise
PayloadTypeError at enqueue and write nothing, leaving the caller's transaction usable; a
payload made not to fit in the enqueue's own transaction (as a later deploy changing the type
would leave it) must fail each attempt before the handler runs, under the task's policy, and
end dead (or cancelled).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from sa_jobqueue import Enqueued
from sa_jobqueue._binds import transient
from sa_jobqueue.database import create_engine
from sa_jobqueue.errors import PayloadTypeError, UnknownJobError
from sa_jobqueue.models import FINISHED_STATUSES, jobs_table
from sa_jobqueue.workflows import Dependency
from tests.model.cluster import Cluster
from tests.model.model import JobRecord, Model, Violation
from tests.model.schedule import Step
from tests.model.tasks import queue

j = jobs_table.c


def producer_engine(cluster: Cluster) -> sa.Engine:
    """The checker's Engine for enqueues of their own: the workers' way in, without the proxy."""
    if cluster.bouncer is not None:
        return create_engine(
            cluster.bouncer.url(cluster.database),
            pooler="transaction",
            pool_pre_ping=False,
            pool_size=3,
        )
    url = cluster.database
    if cluster.role is not None:
        url = url.set(username=cluster.role, password=None)
    return create_engine(url, pool_pre_ping=False, pool_size=3)


def count_failed_tries(engine: sa.Engine, model: Model) -> None:
    """Count, in the report's note, the statements of engine enqueues that failed on a
    transient error (each makes its try fail, and the next try run)."""

    def failed(context: sa.engine.ExceptionContext) -> None:
        if isinstance(context.sqlalchemy_exception, sa.exc.DBAPIError) and transient(
            context.sqlalchemy_exception
        ):
            with model.lock:
                model.checked["failed engine tries"] = (
                    model.checked.get("failed engine tries", 0) + 1
                )

    sa.event.listen(engine, "handle_error", failed)


def misfit(payload: dict[str, Any], how: str) -> dict[str, Any]:
    """``payload`` (a TypedPlan's) made not to fit the type, as ``how`` says; its ``n`` kept
    (as text for ``n_text``), so that the job can be found by ``payload->>'n'``."""
    bad = dict(payload)
    if how == "n_text":
        bad["n"] = str(bad["n"])
    elif how == "k_bool":
        bad["k"] = True
    elif how == "extra_key":
        bad["x"] = 1
    elif how == "no_plan":
        del bad["plan"]
    elif how == "plan_text":
        bad["plan"] = "ok"
    else:
        raise ValueError(f"unknown misfit {how}")
    return bad


def _written(conn: sa.Connection | Session, n: int) -> int:
    """How many ``typed`` jobs hold payload number ``n`` (as the caller's transaction sees)."""
    return conn.execute(  # type: ignore[no-any-return]
        sa.select(sa.func.count()).where(j.task == "typed", j.payload["n"].astext == str(n))
    ).scalar_one()


class Producers:
    """The operations of typed payloads, and what ``Operations``' enqueues do through an
    Engine."""

    engine: sa.Engine
    producer: sa.Engine
    model: Model
    by_step: dict[int, list[int]]

    def _enqueue_in(self, step: Step, call: Callable[[Any], Any]) -> Any:
        """``call`` on the producer Engine (``via``: engine), or in a Session committed here."""
        if step.args.get("via") == "engine":
            return call(self.producer)
        with Session(self.engine) as session, session.begin():
            return call(session)

    def _engine_made(self, step: Step, ids: list[Enqueued], said: str) -> str:
        if step.args.get("via") != "engine":
            return said
        for i in ids:
            if i.created and self.model.has(int(i)):
                self.model.jobs[int(i)].engine = True
        payloads = step.args["payloads"] if "payloads" in step.args else [step.args["payload"]]
        with self.model.lock:
            self.model.engine_calls.append(
                (step.index, step.args["task"], payloads, False, [int(i) for i in ids])
            )
        return said + " via an engine"

    def _gone(self, deps: list[Dependency]) -> str:
        """UnknownJobError is promised for a dependency with no job: one a bulk delete took."""
        with self.engine.connect() as conn:
            there = set(
                conn.execute(sa.select(j.id).where(j.id.in_([d.job_id for d in deps]))).scalars()
            )
        gone = [d.job_id for d in deps if d.job_id not in there]
        if not gone:
            raise UnknownJobError(f"UnknownJobError, yet every dependency exists: {deps}")
        return f"dependencies {gone} deleted: UnknownJobError"

    def op_enqueue_typed(self, step: Step) -> str:
        args = step.args
        good: dict[str, Any] = args["payload"]
        bad = misfit(good, args["misfit"])
        if args["variant"] == "invalid":
            return self._refused(step, bad)
        with Session(self.engine) as session, session.begin():
            job = queue.enqueue(session, "typed", good)
            # As a deploy that changed the type would leave it: stored, no longer fitting.
            session.execute(sa.update(jobs_table).where(j.id == int(job)).values(payload=bad))
        self.model.created(JobRecord(int(job), step.index, "typed", bad, "q1", None, misfit=True))
        return f"job {int(job)} stored with payload {bad}"

    def _refused(self, step: Step, bad: dict[str, Any]) -> str:
        """An invalid payload: PayloadTypeError, nothing written, the transaction usable."""
        n = bad["n"]
        problem = None
        try:
            if step.args["via"] == "engine":
                queue.enqueue(self.producer, "typed", bad)
                problem = "accepted"
            else:
                with Session(self.engine) as session, session.begin():
                    try:
                        queue.enqueue(session, "typed", bad)
                        problem = "accepted"
                    except PayloadTypeError:
                        # The caller's transaction goes on: nothing was sent, nothing aborted.
                        if _written(session, n):
                            problem = "raised, yet wrote its job in the transaction"
                        raise
        except PayloadTypeError as exc:
            said = f"refused: {str(exc)[:120]}"
        except sa.exc.DBAPIError as exc:
            problem = f"left the transaction unusable: {exc.__class__.__name__}: {exc}"[:300]
            said = problem
        else:
            said = "accepted"
        with self.engine.connect() as conn:
            if problem is None and _written(conn, n):
                problem = "raised, yet its job was committed"
        if problem is not None:
            self.model.found.append(
                Violation(
                    "typed_refused",
                    (),
                    f"step {step.index}: enqueue of typed payload {bad} via"
                    f" {step.args['via']}: {problem}",
                )
            )
        return said

    def enqueued_uncertain(
        self, step: Step, task: str, payloads: list[dict[str, Any]], exc: Exception
    ) -> str:
        """An engine enqueue that raised: uncertain if its error was transient, else raise."""
        if not isinstance(exc, sa.exc.DBAPIError) or not transient(exc):
            raise exc
        with self.model.lock:
            self.model.engine_calls.append((step.index, task, payloads, True, []))
        return f"raised {exc.__class__.__name__} after its tries (committed or not)"


def _n(payload: Any) -> str | None:
    return None if not isinstance(payload, dict) or "n" not in payload else str(payload["n"])


def adopt(model: Model, final: Any) -> list[Violation]:
    """``engine_once``: what each engine enqueue left in the table.

    A job in the table that the model does not hold, with the task and payload number of an
    engine enqueue, is that enqueue's: one whose tries raised (its COMMIT went through, its
    reply lost: at most one job a payload), one that the enqueue returned without having
    created it (a try committed, its reply lost, and the next found the job by its unique
    key, as documented), or a duplicate (a try committed, its reply lost, and the next
    enqueued again: documented for a job without a unique key, counted in the note; a
    violation for one with a key). Each is adopted into the model (the other invariants then
    hold it to the same promises). Jobs of no enqueue stay for ``nothing_duplicated``.
    """
    calls: dict[tuple[str, str], tuple[int, bool, list[int]]] = {}
    for step, task, payloads, raised, returned in model.engine_calls:
        for p in payloads:
            calls[(task, str(p["n"]))] = (step, raised, returned)
    extra: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, row in final.jobs.items():
        n = _n(row.payload)
        if i not in model.jobs and n is not None and (row.task, n) in calls:
            extra[(row.task, n)].append(i)
    found = []
    twice = "engine duplicates (documented: COMMIT reply lost)"
    for (task, n), ids in extra.items():
        step, raised, returned = calls[(task, n)]
        for i in ids:
            row = final.jobs[i]
            model.jobs[i] = JobRecord(
                i, step, task, row.payload, row.queue, row.unique_key, engine=True
            )
        more = [i for i in ids if i not in returned]
        if raised and len(ids) > 1:
            found.append(
                Violation(
                    "engine_once",
                    tuple(ids),
                    f"step {step}: an engine enqueue of {task} payload {n} that raised left"
                    f" {len(ids)} jobs",
                )
            )
        elif not raised and any(final.jobs[i].unique_key is not None for i in more):
            found.append(
                Violation(
                    "engine_once",
                    tuple(more),
                    f"step {step}: an engine enqueue of {task} payload {n} with a unique key"
                    f" returned {returned}, yet left {more} too",
                )
            )
        elif not raised and more:
            model.checked[twice] = model.checked.get(twice, 0) + len(more)
    return found


def misfits_failed(model: Model, final: Any) -> list[Violation]:
    """``typed_misfit``: a job whose stored payload does not fit its type never reaches its
    handler (no audited start), and ends dead, its last error a PayloadTypeError (or the
    lease lost, when its worker died with its last attempt), or cancelled."""
    found = []
    for i, record in model.jobs.items():
        row = final.jobs.get(i)
        if not record.misfit or row is None:
            continue
        error = (row.last_error or {}).get("type", "")
        bad = []
        if final.starts.get(i):
            bad.append(f"its handler started ({len(final.starts[i])} attempts)")
        if row.status not in FINISHED_STATUSES or row.status == "succeeded":
            bad.append(f"it is {row.status}")
        if row.status == "dead" and not error.endswith(("PayloadTypeError", "LeaseExpired")):
            bad.append(f"it died of {error!r}")
        if bad:
            found.append(
                Violation(
                    "typed_misfit",
                    (i,),
                    f"stored payload {row.payload} does not fit, yet "
                    + "; ".join(bad)
                    + f" (attempts {row.attempts}/{row.max_attempts})",
                )
            )
    return found
