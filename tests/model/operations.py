"""Each operation of a schedule, done through the public API, its outcome kept in the model.

Every operation is one transaction of the checker's own (committed, on a direct connection
no fault touches), followed by a read of the database's ``clock_timestamp()``: whatever the
operation changed was committed before that moment. Ids come from what ``enqueue`` returned;
a step that names an earlier job (``depends_on``, cancel, requeue, a wait) resolves it here.
An exception from the API is a finding (``api_error``), except the ones the docs promise for
the input given.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from sa_jobqueue import Enqueued
from sa_jobqueue.errors import ResultTimeoutError, UnknownJobError
from sa_jobqueue.models import FINISHED_STATUSES, jobs_table, queues_table
from sa_jobqueue.ops import (
    clear_queue_limits,
    pause_queue,
    resume_queue,
    set_queue_concurrency,
    set_queue_key_concurrency,
    set_queue_key_rate,
    set_queue_rate,
)
from sa_jobqueue.workflows import Call, Dependency
from tests.model.bulk import Bulk
from tests.model.cluster import Cluster, WorkerProc, matching
from tests.model.model import Change, JobRecord, Model, Violation
from tests.model.producers import Producers, count_failed_tries, producer_engine
from tests.model.schedule import Step
from tests.model.tasks import KEEPS, queue

j = jobs_table.c
#: How many of the newest jobs a cancel or a wait picks from (so it hits live ones).
RECENT = 20
#: A burst's time for its last claims and completions, and a loaded machine, in seconds.
BURST_BASE = 20.0
#: A burst's time per job it may still have to run: the longest plan action (3 s) and its
#: completion, one after another at a cap of 1 (slower than any rate of the mix).
BURST_PER_JOB = 3.5


def burst_bound(backlog: int) -> float:
    """Seconds a burst has to exit once nothing is enqueued, given the jobs of its queues
    that are not paused and not ended."""
    return BURST_BASE + BURST_PER_JOB * backlog


@dataclass
class Burst:
    """A burst worker the schedule started, and on which queues."""

    step: int
    worker: WorkerProc
    queues: list[str]
    began: float
    aborted: bool = False  # SIGABRT by the checker: its exit status says nothing


class Operations(Producers, Bulk):
    """Runs operations against one database and writes what they did into ``model``."""

    def __init__(self, engine: sa.Engine, model: Model, cluster: Cluster | None = None) -> None:
        self.engine = engine
        self.model = model
        self.cluster = cluster
        #: What enqueues through an Engine use (see :mod:`.producers`).
        self.producer = engine if cluster is None else producer_engine(cluster)
        if cluster is not None:
            count_failed_tries(self.producer, model)
        self.watchers: list[threading.Thread] = []
        self.bursts: list[Burst] = []
        self.by_step: dict[int, list[int]] = {}
        # Per unique key: enqueues of it under way, and how many have begun. A holder's
        # payload is checked only when no other enqueue of its key overlapped this one (the
        # clients run at once: another's replace may land between a commit and its check).
        self._keys = threading.Lock()
        self._busy: Counter[str] = Counter()
        self._begun: Counter[str] = Counter()

    def close(self) -> None:
        if self.producer is not self.engine:
            self.producer.dispose()

    def clock(self) -> datetime:
        with self.engine.connect() as conn:
            return conn.execute(sa.select(sa.func.clock_timestamp())).scalar_one()  # type: ignore[no-any-return]

    def run(self, step: Step) -> str:
        handler: Callable[[Step], str] = getattr(self, "op_" + step.kind)
        return handler(step)

    # -- enqueues ---------------------------------------------------------------------------

    def _deps(self, refs: list[dict[str, Any]]) -> list[Dependency]:
        edges: dict[int, Dependency] = {}
        for ref in refs:
            ids = self.by_step.get(ref["step"], [])
            if ids:
                job = ids[ref["pos"] % len(ids)]
                if not (self.model.has(job) and self.model.jobs[job].deleted):
                    edges.setdefault(job, Dependency(job, ref["on_failure"]))
        return list(edges.values())

    @staticmethod
    def _options(args: dict[str, Any]) -> dict[str, Any]:
        options: dict[str, Any] = {}
        for name in ("queue", "priority", "max_attempts", "unique_mode", "unique_key"):
            if name in args:
                options[name] = args[name]
        if "run_at_ms" in args:
            options["run_at"] = timedelta(milliseconds=args["run_at_ms"])
        if "lease_ms" in args:
            options["lease"] = timedelta(milliseconds=args["lease_ms"])
        if "unique_period_s" in args:
            options["unique_period"] = timedelta(seconds=args["unique_period_s"])
        return options

    def _record(
        self,
        step: Step,
        task: str,
        payloads: list[dict[str, Any]],
        ids: list[Enqueued],
        options: dict[str, Any],
        deps: list[list[Dependency]],
        begun: dict[str, int],
    ) -> str:
        declared = queue.get_task(task)
        created = 0
        keys = [
            options.get("unique_key") or (declared.unique_key(p) if declared.unique_key else None)
            for p in payloads
        ]
        # A key repeated within a batch keeps its last payload (as calls one after another).
        last = {k: p for k, p in zip(keys, payloads, strict=True) if k is not None}
        for job_id, payload, edges, key in zip(ids, payloads, deps, keys, strict=True):
            if job_id.created and not self.model.has(int(job_id)):
                created += 1
                self.model.created(
                    JobRecord(
                        int(job_id),
                        step.index,
                        task,
                        payload,
                        options.get("queue", declared.queue),
                        key,
                        [(d.job_id, d.on_failure) for d in edges],
                    )
                )
            elif not job_id.created:
                self.model.returned.append((int(job_id), step.index, task, key))
                expected = last.get(key, payload) if key is not None else payload
                alone = key is None or self._alone(key, begun.get(key, 0))
                self._check_holder(step, int(job_id), task, key, expected, job_id.updated, alone)
        # After the jobs are in the model: a racing step may resolve its reference now.
        self.by_step.setdefault(step.index, [int(i) for i in ids])
        return f"ids {[int(i) for i in ids]} ({created} created)"

    def _check_holder(
        self,
        step: Step,
        job_id: int,
        task: str,
        key: str | None,
        payload: dict[str, Any],
        updated: bool,
        alone: bool,
    ) -> None:
        """An enqueue that created nothing returned the job holding its key (and changed it)."""
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(j.task, j.unique_key, j.payload, j.status).where(j.id == job_id)
            ).one_or_none()
        if row is None and self.model.has(job_id):
            return  # ended and deleted by a bulk delete since: nothing_lost judges that
        if row is None or row.task != task or row.unique_key != key:
            self.model.found.append(
                Violation(
                    "unique_holder",
                    (job_id,),
                    f"step {step.index}: enqueue of key {key!r} of {task} returned job"
                    f" {job_id}, which is {row and (row.task, row.unique_key)}",
                )
            )
        elif updated and alone and row.payload != payload:
            self.model.found.append(
                Violation(
                    "unique_replaced",
                    (job_id,),
                    f"step {step.index}: enqueue said it replaced job {job_id}'s payload"
                    f" with {payload}, the job has {row.payload} ({row.status})",
                )
            )

    def _key_names(
        self, task: str, payloads: list[dict[str, Any]], options: dict[str, Any]
    ) -> set[str]:
        declared = queue.get_task(task)
        if "unique_key" in options:
            return {options["unique_key"]}
        if declared.unique_key is None:
            return set()
        return {k for k in map(declared.unique_key, payloads) if k is not None}

    @contextlib.contextmanager
    def _enqueueing(self, keys: set[str]) -> Iterator[dict[str, int]]:
        """Mark the enqueue of ``keys`` under way; yield each key's count of begun enqueues
        (with ``-1`` for a key another enqueue was already busy with)."""
        with self._keys:
            begun = {}
            for k in keys:
                self._begun[k] += 1
                begun[k] = -1 if self._busy[k] else self._begun[k]
                self._busy[k] += 1
        try:
            yield begun
        finally:
            with self._keys:
                for k in keys:
                    self._busy[k] -= 1

    def _alone(self, key: str, begun: int) -> bool:
        """No other enqueue of ``key`` was under way when this began, or began since."""
        with self._keys:
            return begun == self._begun[key]

    def op_enqueue(self, step: Step) -> str:
        args = step.args
        options = self._options(args)
        deps = self._deps(args["depends_on"])
        with self._enqueueing(self._key_names(args["task"], [args["payload"]], options)) as b:
            try:
                job_id = self._enqueue_in(
                    step,
                    lambda target: queue.enqueue(
                        target, args["task"], args["payload"], depends_on=deps or None, **options
                    ),
                )
            except UnknownJobError:
                return self._gone(deps)
            except sa.exc.DBAPIError as exc:
                if args.get("via") != "engine":
                    raise
                return self.enqueued_uncertain(step, args["task"], [args["payload"]], exc)
            said = self._record(step, args["task"], [args["payload"]], [job_id], options, [deps], b)
            return self._engine_made(step, [job_id], said)

    def op_enqueue_many(self, step: Step) -> str:
        args = step.args
        options = self._options(args)
        deps = self._deps(args["depends_on"])
        payloads = args["payloads"]
        with self._enqueueing(self._key_names(args["task"], payloads, options)) as b:
            try:
                ids = self._enqueue_in(
                    step,
                    lambda target: queue.enqueue_many(
                        target, args["task"], payloads, depends_on=deps or None, **options
                    ),
                )
            except UnknownJobError:
                return self._gone(deps)
            except sa.exc.DBAPIError as exc:
                if args.get("via") != "engine":
                    raise
                return self.enqueued_uncertain(step, args["task"], payloads, exc)
            deps_each = [deps] * len(payloads)
            said = self._record(step, args["task"], payloads, ids, options, deps_each, b)
            return self._engine_made(step, ids, said)

    def op_enqueue_quick(self, step: Step) -> str:
        """A batch of ``quick`` jobs: an ``enqueue_many`` like any other."""
        return self.op_enqueue_many(step)

    def op_enqueue_batch(self, step: Step) -> str:
        """Jobs of the ``batched`` batch task: an ``enqueue_many`` like any other."""
        return self.op_enqueue_many(step)

    def op_enqueue_limited(self, step: Step) -> str:
        """A job of the hard-limited ``limited`` task: an ``enqueue`` like any other."""
        return self.op_enqueue(step)

    def _calls(self, step: Step) -> list[Call]:
        return [Call(c["task"], c["payload"]) for c in step.args["calls"]]

    def _record_calls(self, step: Step, ids: list[Enqueued], deps: list[list[Dependency]]) -> str:
        for job_id, call, edges in zip(ids, step.args["calls"], deps, strict=True):
            self.model.created(
                JobRecord(
                    int(job_id),
                    step.index,
                    call["task"],
                    call["payload"],
                    queue.get_task(call["task"]).queue,
                    None,
                    [(d.job_id, d.on_failure) for d in edges],
                )
            )
        self.by_step[step.index] = [int(i) for i in ids]
        return f"ids {[int(i) for i in ids]}"

    def op_chain(self, step: Step) -> str:
        policy = step.args["on_failure"]
        with Session(self.engine) as session, session.begin():
            ids = queue.chain(session, self._calls(step), on_failure=policy)
        deps: list[list[Dependency]] = [[]]
        deps += [[Dependency(ids[i], policy)] for i in range(len(ids) - 1)]
        return self._record_calls(step, ids, deps)

    def op_group(self, step: Step) -> str:
        with Session(self.engine) as session, session.begin():
            ids = queue.group(session, self._calls(step))
        return self._record_calls(step, ids, [[] for _ in ids])

    def op_chord(self, step: Step) -> str:
        policy = step.args["on_failure"]
        calls = self._calls(step)
        with Session(self.engine) as session, session.begin():
            *members, last = queue.chord(session, calls[:-1], calls[-1], on_failure=policy)
        deps: list[list[Dependency]] = [[] for _ in members]
        deps.append([Dependency(m, policy) for m in members])
        return self._record_calls(step, [*members, last], deps)

    # -- job admin --------------------------------------------------------------------------

    def _pick(self, pick: int, among: list[int]) -> int | None:
        return among[pick % len(among)] if among else None

    def op_cancel(self, step: Step) -> str:
        ref = step.args.get("ref")
        if ref is not None:  # a race's cancel: the job the racing enqueues depend on
            ids = self.by_step.get(ref["step"], [])
            job_id = ids[ref["pos"] % len(ids)] if ids else None
        else:
            job_id = self._pick(step.args["pick"], self._live_ids()[-RECENT:])
        if job_id is None:
            return "no job"
        with Session(self.engine) as session, session.begin():
            before = session.execute(sa.select(j.status).where(j.id == job_id)).scalar_one_or_none()
            done = queue.cancel(session, job_id)
        if before is None:  # deleted by a bulk delete meanwhile
            return f"job {job_id} deleted: {done}"
        if done and self.model.has(job_id):
            self.model.jobs[job_id].cancelled_by_checker = True
        return f"job {job_id} ({before}): {done}"

    def _live_ids(self) -> list[int]:
        """Job ids in the order recorded, without those a bulk delete took."""
        return [i for i in self.model.order() if not self.model.jobs[i].deleted]

    def op_requeue(self, step: Step) -> str:
        mine = self.model.order()
        with self.engine.connect() as conn:
            dead = list(
                conn.execute(
                    sa.select(j.id).where(j.id.in_(mine), j.status == "dead").order_by(j.id)
                ).scalars()
            )
        job_id = self._pick(step.args["pick"], dead)
        if job_id is None:
            return "no dead job"
        with Session(self.engine) as session, session.begin():
            done = queue.requeue(session, job_id)
        if done:
            self.model.jobs[job_id].requeued += 1
        return f"job {job_id}: {done}"

    def op_wait_result(self, step: Step) -> str:
        kept = [i for i in self._live_ids() if self.model.jobs[i].task in KEEPS][-RECENT:]
        job_id = self._pick(step.args["pick"], kept)
        if job_id is None:
            return "no job keeps a result"
        try:
            outcome = queue.wait_for_result(self.engine, job_id, timeout=1.0)
        except ResultTimeoutError:
            return f"job {job_id}: not ended within 1 s"
        except UnknownJobError:
            return f"job {job_id}: deleted (UnknownJobError)"  # nothing_lost says if not
        if outcome.succeeded:
            with self.engine.connect() as conn:
                payload = conn.execute(
                    sa.select(j.payload).where(j.id == job_id)
                ).scalar_one_or_none()
            if payload is not None and outcome.value != {"n": payload["n"]}:
                self.model.found.append(
                    Violation(
                        "kept_result",
                        (job_id,),
                        f"step {step.index}: wait_for_result gave {outcome.value!r} for"
                        f" payload {payload}",
                    )
                )
        return f"job {job_id}: {outcome.status}"

    # -- burst workers ----------------------------------------------------------------------

    def op_burst(self, step: Step) -> str:
        """Start ``sa-jobqueue worker --burst`` on some queues; a thread watches it exit.

        While the schedule plays, a burst may run as long as its queues are fed (a burst
        claims what its own jobs free). Its bound starts when the play ends: see
        :meth:`settle_bursts`. Exiting with a status other than 0 is a finding at once.
        """
        assert self.cluster is not None
        queues = step.args["queues"]
        worker = self.cluster.start_worker(burst=queues)
        burst = Burst(step.index, worker, queues, time.monotonic())
        self.bursts.append(burst)
        watcher = threading.Thread(target=self._watch, args=(burst,), daemon=True)
        watcher.start()
        self.watchers.append(watcher)
        return f"burst {worker.pid} on {','.join(queues)}"

    def _watch(self, burst: Burst) -> None:
        code = burst.worker.proc.wait()
        if code != 0 and not burst.aborted:
            self.model.found.append(
                Violation(
                    "burst_exits",
                    (),
                    f"step {burst.step}: burst worker {burst.worker.pid} on"
                    f" {','.join(burst.queues)} exited {code} after"
                    f" {time.monotonic() - burst.began:.1f}s:\n"
                    + self.cluster_output(burst.worker),
                )
            )

    def settle_bursts(self) -> None:
        """``burst_exits``: once the play has ended (nothing is enqueued any more), each burst
        still running exits within :func:`burst_bound` of the jobs of its queues that are not
        paused and not ended.

        A burst waits only for what it controls: its own jobs and their completions, and
        rate windows that open within 10 s; it exits at once on a pause, on other workers'
        slots, on dependencies, on jobs not due. So, with nothing more enqueued, it has at
        most those jobs to run, one after another at worst (a cap of 1). A burst still
        running at its bound gets SIGABRT (its threads' stacks go to its log).
        """
        live = [b for b in self.bursts if b.worker.alive()]
        deadlines = []
        with self.engine.connect() as conn:
            for burst in live:
                backlog = conn.execute(
                    sa.select(sa.func.count())
                    .select_from(
                        jobs_table.outerjoin(queues_table, queues_table.c.queue == j.queue)
                    )
                    .where(
                        j.queue.in_(matching(burst.queues)),
                        j.status.not_in(FINISHED_STATUSES),
                        queues_table.c.paused_at.is_(None),
                    )
                ).scalar_one()
                deadlines.append((burst, backlog, time.monotonic() + burst_bound(backlog)))
        for burst, backlog, deadline in deadlines:
            with contextlib.suppress(subprocess.TimeoutExpired):
                burst.worker.proc.wait(max(0.0, deadline - time.monotonic()))
            if burst.worker.alive():
                evidence = self._queues(matching(burst.queues))
                burst.aborted = True
                burst.worker.proc.send_signal(signal.SIGABRT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    burst.worker.proc.wait(5)
                burst.worker.proc.kill()
                self.model.found.append(
                    Violation(
                        "burst_exits",
                        (),
                        f"step {burst.step}: burst worker {burst.worker.pid} on"
                        f" {','.join(burst.queues)} still running"
                        f" {burst_bound(backlog):.1f}s after the play ended ({backlog} jobs of"
                        f" its queues not paused and not ended then); queues now: {evidence}\n"
                        + self.cluster_output(burst.worker),
                    )
                )

    def cluster_output(self, worker: WorkerProc) -> str:
        assert self.cluster is not None
        return self.cluster.output(worker)

    def _queues(self, queues: list[str]) -> str:
        """Each queue's pause, limits and jobs by status, for a burst's evidence."""
        with self.engine.connect() as conn:
            settings = {
                r.queue: f"paused={r.paused_at is not None} cap={r.concurrency} rate={r.rate_limit}"
                f"/{r.rate_period} key_cap={r.key_concurrency}"
                f" key_rate={r.key_rate_limit}/{r.key_rate_period}"
                for r in conn.execute(
                    sa.select(queues_table).where(queues_table.c.queue.in_(queues))
                )
            }
            counts = conn.execute(
                sa.select(j.queue, j.status, sa.func.count())
                .where(j.queue.in_(queues))
                .group_by(j.queue, j.status)
            ).all()
        jobs = {q: {s: n for qq, s, n in counts if qq == q} for q in queues}
        return "; ".join(f"{q}: {settings.get(q, 'no settings')} jobs {jobs[q]}" for q in queues)

    # -- queues -----------------------------------------------------------------------------

    def _change(self, step: Step, what: str, value: Any, call: Callable[[Session], Any]) -> str:
        before = self.clock()
        with Session(self.engine) as session, session.begin():
            said = call(session)
        self.model.changes.append(
            Change(step.index, step.args["queue"], what, value, self.clock(), before)
        )
        return f"{step.args['queue']}: {said}"

    def op_pause(self, step: Step) -> str:
        q = step.args["queue"]
        return self._change(step, "pause", True, lambda s: pause_queue(s, q))

    def op_resume(self, step: Step) -> str:
        q = step.args["queue"]
        return self._change(step, "resume", False, lambda s: resume_queue(s, q))

    def op_set_cap(self, step: Step) -> str:
        q, cap = step.args["queue"], step.args["cap"]
        return self._change(step, "cap", cap, lambda s: set_queue_concurrency(s, q, cap))

    def op_set_key_cap(self, step: Step) -> str:
        q, cap = step.args["queue"], step.args["cap"]
        return self._change(
            step, "key_cap", cap, lambda s: set_queue_key_concurrency(s, q, cap, key="k")
        )

    def op_set_rate(self, step: Step) -> str:
        q, rate = step.args["queue"], step.args["rate"]
        return self._change(step, "rate", rate, lambda s: set_queue_rate(s, q, rate))

    def op_set_key_rate(self, step: Step) -> str:
        q, rate = step.args["queue"], step.args["rate"]
        return self._change(
            step, "key_rate", rate, lambda s: set_queue_key_rate(s, q, rate, key="k")
        )

    def op_clear_limits(self, step: Step) -> str:
        q = step.args["queue"]
        return self._change(step, "clear", None, lambda s: clear_queue_limits(s, q))
