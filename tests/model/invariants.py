"""The invariants: each a named function returning the violations it finds, with evidence.

Two kinds. :func:`sample` runs every 100 ms or so while the schedule plays, on one snapshot of
the jobs table (the limits that hold at any instant). The others run once at quiescence,
on the final tables, the handlers' audit (``mc_starts``, ``mc_effects``) and the model.
Times are the database's: ``started_at`` and ``finished_at`` as the queue wrote them, the
audit's ``clock_timestamp()``, and the clock read after each of the checker's commits.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from sa_jobqueue.models import FINISHED_STATUSES, jobs_table, queues_table, workers_table
from tests.model.history import attempt_history
from tests.model.model import Model, Violation
from tests.model.plans import batch_form, hard_limits, plans_followed
from tests.model.producers import adopt, misfits_failed
from tests.model.tasks import BATCHES, CALLBACK, CALLING, KEEPS, LATE, effects, ends, starts

j = jobs_table.c


# -- sampled while running -------------------------------------------------------------------


def sample(conn: sa.Connection, model: Model) -> list[Violation]:
    """Check the instant's limits on one snapshot (run it in a REPEATABLE READ transaction).

    ``caps``: the jobs of a capped queue running with a live lease, among those that started
    after the cap was last set (a lowered cap stops no job that started before it), are no
    more than the cap. ``key_caps``: the same per task and payload key. ``unique_live``: no
    two queued or running jobs of one task hold one unique key.
    """
    rows = conn.execute(
        sa.select(
            j.id,
            j.queue,
            j.task,
            j.payload["k"].astext.label("k"),
            j.started_at,
            j.worker,
            j.visible_at,
            j.attempts,
            (j.visible_at > sa.func.now()).label("live"),
            sa.func.now().label("now"),
        ).where(j.status == "running")
    ).all()
    settings = {
        r.queue: {"cap": r.concurrency, "key_cap": r.key_concurrency}
        for r in conn.execute(sa.select(queues_table))
    }
    found: list[Violation] = []
    for q in {r.queue for r in rows}:
        for what, group in (("cap", lambda r: ()), ("key_cap", lambda r: (r.task, r.k))):
            cap, since = model.cap_since(q, what)
            if cap is None or since is None or settings.get(q, {}).get(what) != cap:
                continue  # no cap, or one the model has not recorded yet (committing now)
            held: dict[Any, list[int]] = defaultdict(list)
            shown: dict[int, str] = {}
            for r in rows:
                if r.queue == q and r.live and r.started_at >= since:
                    if what == "key_cap" and r.k is None:
                        continue
                    held[group(r)].append(r.id)
                    shown[r.id] = (
                        f"{r.id} attempt {r.attempts} by {r.worker} started {r.started_at}"
                        f" lease to {r.visible_at}"
                    )
            for key, ids in held.items():
                if len(ids) > cap:
                    found.append(
                        Violation(
                            "caps" if what == "cap" else "key_caps",
                            tuple(ids),
                            f"queue {q} {key or ''}: {len(ids)} running with live leases,"
                            f" started since the {what} of {cap} was set at {since}"
                            f" (now {rows[0].now}): " + "; ".join(shown[i] for i in ids),
                        )
                    )
    found += worker_bound(conn, model)
    live = conn.execute(
        sa.select(j.task, j.unique_key, sa.func.array_agg(j.id))
        .where(j.unique_key.is_not(None), j.status.in_(("queued", "running")))
        .group_by(j.task, j.unique_key)
        .having(sa.func.count() > 1)
    ).all()
    for task, key, ids in live:
        found.append(Violation("unique_live", tuple(ids), f"{task} key {key} held by {ids}"))
    return found


#: How long after its handler ended a job may still be ``running`` with a live lease
#: without counting against its worker's bound: its completion waits for its thread's group
#: commit (at most GROUP_MAX_AGE, 50 ms, after the group opened) and the commit itself.
COMPLETING = timedelta(seconds=1)


def worker_bound(conn: sa.Connection, model: Model) -> list[Violation]:
    """``worker_bound``: no worker holds more running jobs than it may (backpressure).

    A worker holds at most its threads' jobs, those it claimed ahead (the prefetch, or the
    adaptive buffer's ceiling) and a batch of completions being retried (one a thread):
    ``model.most_held``. Counted, by the jobs' ``worker``
    column: running jobs with a live lease, except those whose current attempt's handler
    ended (``mc_ends``) within the last second, whose completion may still wait for its
    group's commit. A job whose handler ended earlier and that is still running with a live
    lease is one whose outcome its worker has not recorded, yet is still counted as its.

    Left out as well: jobs whose current attempt ran in its thread's group (``mc_starts.
    grouped``), and every job of a task whose audit is written late (``tasks.LATE``, whose
    attempts are grouped but say so only later). A group holds up to GROUP_MAX_JOBS ended
    jobs, its thread already on to the next, and its commit may wait on a silent connection
    or a stopped process for seconds: its jobs are held legitimately, beyond this bound.

    Batch tasks: a thread running a batch holds all its jobs (``max_size`` at most). So the
    jobs of other tasks are held to the bound above, and all jobs together to that bound plus
    ``max_size - 1`` a thread.
    """
    ended = (
        sa.select(ends.c.id)
        .where(
            ends.c.job_id == j.id,
            ends.c.attempt == j.attempts,
            ends.c.at > sa.func.now() - COMPLETING,
        )
        .exists()
    )
    grouped = (
        sa.select(starts.c.id)
        .where(starts.c.job_id == j.id, starts.c.attempt == j.attempts, starts.c.grouped.is_(True))
        .exists()
    )
    batch = j.task.in_(sorted(BATCHES))
    rows = conn.execute(
        sa.select(
            j.worker,
            sa.func.array_agg(j.id).filter(~batch).label("single"),
            sa.func.array_agg(j.id).label("all"),
            sa.func.now(),
        )
        .where(
            j.status == "running",
            j.visible_at > sa.func.now(),
            ~ended,
            ~grouped,
            j.task.not_in(sorted(LATE)),
        )
        .group_by(j.worker)
        .having(sa.func.count() > model.most_held)
    ).all()
    # A thread running a batch holds its batch's jobs: up to the largest max_size a thread.
    most = model.most_held + model.threads * (max(BATCHES.values(), default=1) - 1)
    found = []
    for worker, single, both, now in rows:
        single = single or []
        if len(single) > model.most_held:
            found.append(
                Violation(
                    "worker_bound",
                    tuple(sorted(single)),
                    f"worker {worker} holds {len(single)} running jobs (of tasks that are not"
                    f" batch tasks) with live leases at {now}, more than its {model.most_held}"
                    " (threads, most claimed ahead, a batch of completions)",
                )
            )
        elif len(both) > most:
            found.append(
                Violation(
                    "worker_bound",
                    tuple(sorted(both)),
                    f"worker {worker} holds {len(both)} running jobs with live leases at {now},"
                    f" more than its {most} (threads, most claimed ahead, a batch of"
                    " completions, and each thread's batch of a batch task)",
                )
            )
    return found


# -- at quiescence ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Final:
    """The final state, read once: jobs by id, each job's effects and audited starts."""

    jobs: dict[int, Any]
    effects: dict[int, list[int]]  # job -> attempts of its committed effects
    starts: dict[int, list[Any]]  # job -> its audited starts (attempt, pid, at)
    workers: list[Any]
    ends: dict[tuple[int, int], list[Any]]  # (job, attempt) -> its handlers' ends (pid, at)

    @classmethod
    def read(cls, conn: sa.Connection) -> Final:
        jobs = {r.id: r for r in conn.execute(sa.select(jobs_table))}
        found: dict[int, list[int]] = defaultdict(list)
        for r in conn.execute(sa.select(effects.c.job_id, effects.c.attempt)):
            found[r.job_id].append(r.attempt)
        began: dict[int, list[Any]] = defaultdict(list)
        for r in conn.execute(sa.select(starts).order_by(starts.c.id)):
            began[r.job_id].append(r)
        workers = list(conn.execute(sa.select(workers_table)))
        ended: dict[tuple[int, int], list[Any]] = defaultdict(list)
        for r in conn.execute(sa.select(ends)):
            ended[(r.job_id, r.attempt)].append(r)
        return cls(jobs, dict(found), dict(began), workers, dict(ended))


def terminal(model: Model, final: Final) -> list[Violation]:
    """Nothing stuck: at quiescence every job the checker created has ended."""
    stuck = [
        i for i in model.jobs if i in final.jobs and final.jobs[i].status not in FINISHED_STATUSES
    ]
    if not stuck:
        return []
    lines = [
        f"{i}: {r.status} attempts {r.attempts}/{r.max_attempts} queue {r.queue} visible_at"
        f" {r.visible_at} worker {r.worker} error {str(r.last_error)[:120]}"
        for i in stuck[:8]
        for r in [final.jobs[i]]
    ]
    return [
        Violation("terminal", tuple(stuck), "not ended at quiescence:\n    " + "\n    ".join(lines))
    ]


def nothing_lost(model: Model, final: Final) -> list[Violation]:
    """Every job the checker's commits created exists, but those its bulk deletes deleted; no
    job exists that none created."""
    found = []
    lost = [i for i, r in model.jobs.items() if i not in final.jobs and not r.deleted]
    if lost:
        found.append(Violation("nothing_lost", tuple(lost), "created, committed, and gone"))
    # Error callbacks are created by the statement that moves a job to dead, not by an
    # enqueue: error_callbacks checks them.
    extra = [i for i in final.jobs if i not in model.jobs and final.jobs[i].task != CALLBACK]
    if extra:
        found.append(
            Violation("nothing_duplicated", tuple(extra), "in the table, created by no enqueue")
        )
    return found


def error_callbacks(model: Model, final: Final) -> list[Violation]:
    """Each death of a job of a task with ``on_error`` enqueued one callback job, in the same
    statement: a dead job has a callback for the attempt it died at; no two callbacks name one
    job at one attempt (a job requeued that dies again has one per death, at its later
    attempts); every callback names a job of such a task that died (it is dead now, or was
    requeued since), with its task and its error; and no job of another task has one."""
    found = []
    named: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, r in final.jobs.items():
        if r.task == CALLBACK:
            named[(r.payload["job_id"], r.payload["attempts"])].append(i)
    for (job_id, attempts), ids in named.items():
        died = final.jobs.get(job_id)
        if len(ids) > 1:
            found.append(Violation("error_callbacks", (job_id,), f"{len(ids)} callbacks for one"
                                   f" death at attempt {attempts}: jobs {ids}"))  # fmt: skip
        if died is None:
            continue  # purged since by a bulk delete (the callback outlives it)
        payload = final.jobs[ids[0]].payload
        if died.task not in CALLING:
            found.append(Violation("error_callbacks", (job_id,), f"a callback for a job of"
                                   f" {died.task}, which names none"))  # fmt: skip
        elif payload["task"] != died.task or not isinstance(payload["error"], dict):
            found.append(Violation("error_callbacks", (job_id,), f"callback payload {payload}"))
        elif died.status != "dead" and not model.jobs.get(job_id, _NOBODY).requeued:
            why = f"a callback at attempt {attempts}, the job {died.status} and never requeued"
            found.append(Violation("error_callbacks", (job_id,), why))
    model.checked["error callbacks"] = model.checked.get("error callbacks", 0) + sum(
        len(ids) for ids in named.values()
    )
    for i, r in final.jobs.items():
        if r.task in CALLING and r.status == "dead" and (i, r.attempts) not in named:
            found.append(Violation("error_callbacks", (i,), f"dead at attempt {r.attempts}"
                                   " with no callback"))  # fmt: skip
    return found


class _Nobody:
    requeued = 0


_NOBODY = _Nobody()


def effects_once(model: Model, final: Final) -> list[Violation]:
    """A succeeded job's ``ctx.session`` effect exists once, its last attempt's; others none."""
    found = []
    for i in model.jobs:
        row = final.jobs.get(i)
        if row is None:
            continue
        attempts = final.effects.get(i, [])
        if row.status == "succeeded":
            if attempts != [row.attempts]:
                found.append(
                    Violation(
                        "effects_once",
                        (i,),
                        f"succeeded at attempt {row.attempts}; committed effects of attempts"
                        f" {attempts}",
                    )
                )
        elif attempts:
            found.append(
                Violation(
                    "effects_once",
                    (i,),
                    f"{row.status} (attempt {row.attempts}), yet effects of attempts {attempts}"
                    " committed",
                )
            )
    return found


def attempts_once(model: Model, final: Final) -> list[Violation]:
    """No attempt number of a job was handed to two executions (the fencing token is unique).

    Even a job handed back by a worker's shutdown after its handler started keeps its
    attempt's number, and so do the jobs of a group rolled back because one of them could no
    longer complete: the next claim runs the next attempt, grouped or not.
    """
    found = []
    for i, began in final.starts.items():
        twice = [a for a, n in Counter(s.attempt for s in began).items() if n > 1]
        if twice:
            runs = [
                (s.attempt, s.pid, str(s.at), "grouped" if s.grouped else "alone")
                for s in began
                if s.attempt in twice
            ]
            found.append(Violation("attempts_once", (i,), f"attempts run twice: {runs}"))
    return found


def session_usable(model: Model, final: Final) -> list[Violation]:
    """A handler's ``ctx.session`` can be used: its statement may fail on a lost connection
    (the driver's error), never with SQLAlchemy refusing the connection outright (a
    transaction left invalid, one already begun, a closed connection: ``tasks.unusable``).
    The handlers make one statement, so such a session came from the worker in that state:
    a connection an earlier job lost, kept for the next."""
    bad = {key: r for key, rows in final.ends.items() for r in rows if r.unusable}
    if not bad:
        return []
    lines = [f"{job} attempt {attempt}: {r.error}" for (job, attempt), r in list(bad.items())[:8]]
    return [
        Violation(
            "session_usable",
            tuple(sorted({job for job, _ in bad})),
            f"{len(bad)} attempts got a session they could not use:\n    " + "\n    ".join(lines),
        )
    ]


def kept_results(model: Model, final: Final) -> list[Violation]:
    """A succeeded job of a task that keeps results holds what its payload says; others none."""
    found = []
    for i, record in model.jobs.items():
        row = final.jobs.get(i)
        if row is None:
            continue
        keeps = record.task in KEEPS
        expected = {"n": row.payload["n"]} if keeps and row.status == "succeeded" else None
        if row.result != expected:
            found.append(
                Violation(
                    "kept_result",
                    (i,),
                    f"{record.task} {row.status}: result {row.result!r}, expected {expected!r}",
                )
            )
    return found


def dependency_order(model: Model, final: Final) -> list[Violation]:
    """No job starts before its dependencies have ended; dependents follow their policy.

    A dependency requeued after it ended is left out (it ends again later, by design).
    """
    found = []
    for i, record in model.jobs.items():
        row = final.jobs.get(i)
        if row is None or not record.deps:
            continue
        deps = [(d, p) for d, p in record.deps if d in final.jobs and model.jobs[d].requeued == 0]
        if len(deps) != len(record.deps):
            continue
        began = final.starts.get(i, [])
        failed = []
        for d, policy in deps:
            dep = final.jobs[d]
            if dep.finished_at is None:
                if began:
                    found.append(
                        Violation(
                            "dependency_order",
                            (i, d),
                            f"job {i} started at {began[0].at} while dependency {d} is"
                            f" {dep.status}",
                        )
                    )
                continue
            early = [s for s in began if s.at < dep.finished_at]
            if early:
                found.append(
                    Violation(
                        "dependency_order",
                        (i, d),
                        f"job {i} attempt {early[0].attempt} started at {early[0].at}, before"
                        f" dependency {d} ended ({dep.status}) at {dep.finished_at}",
                    )
                )
            if dep.status in ("dead", "cancelled") and policy == "cancel":
                failed.append(d)
        if failed and row.status != "cancelled":
            found.append(
                Violation(
                    "dependency_policy",
                    (i, *failed),
                    f"dependencies {failed} failed (on_failure=cancel) but job {i} is {row.status}",
                )
            )
        if failed and began:
            found.append(
                Violation(
                    "dependency_policy",
                    (i, *failed),
                    f"dependencies {failed} failed (on_failure=cancel) but job {i} ran",
                )
            )
        if (
            not failed
            and row.status == "cancelled"
            and not record.cancelled_by_checker
            and all(final.jobs[d].status in FINISHED_STATUSES for d, _ in deps)
        ):
            found.append(
                Violation(
                    "dependency_policy",
                    (i,),
                    f"no dependency failed with on_failure=cancel, yet job {i} was cancelled:"
                    f" {row.last_error}",
                )
            )
    return found


def cancels_honoured(model: Model, final: Final) -> list[Violation]:
    """A job whose cancel returned True ends cancelled (a running one when its attempt ends)."""
    bad = [
        i
        for i, r in model.jobs.items()
        if r.cancelled_by_checker and i in final.jobs and final.jobs[i].status != "cancelled"
    ]
    if not bad:
        return []
    lines = [f"{i}: {final.jobs[i].status}" for i in bad[:8]]
    return [
        Violation("cancel_honoured", tuple(bad), "cancel returned True, but " + ", ".join(lines))
    ]


def _in_force(model: Model, queue: str, what: str) -> list[tuple[str, datetime, datetime]]:
    """The spans during which a rate of ``what`` ("rate" or "key_rate") was surely in force on
    ``queue`` and unchanged: (rate, from, to), database clock.

    A change committed between its ``before`` and its ``at``. Its rate is surely in force from
    its ``at`` until the ``before`` of the next change of that rate (or a clear), provided no
    other change's span overlaps its own (two clients changing one queue at once: which
    committed last is not known, so neither is trusted). A span runs on to the end if no
    change follows.
    """
    changes = [
        c
        for c in model.changes
        if c.queue == queue and c.what in (what, "clear") and c.before is not None
    ]
    spans = []
    for c in changes:
        assert c.before is not None
        if c.what == "clear" or c.value is None:
            continue
        others = [o for o in changes if o is not c]
        if any(o.before <= c.at and o.at >= c.before for o in others if o.before is not None):
            continue
        later = [o.before for o in others if o.before is not None and o.before > c.at]
        spans.append((c.value, c.at, min(later, default=datetime.max.replace(tzinfo=c.at.tzinfo))))
    return spans


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _windows(rate: str) -> tuple[int, timedelta]:
    """``"3/0.5s"`` -> (3, 0.5 s): the limit and the period (the mix's rates are in seconds)."""
    limit, _, period = rate.partition("/")
    return int(limit), timedelta(seconds=float(period.rstrip("s") or 1))


def rates(model: Model, final: Final) -> list[Violation]:
    """``rates``: at most N attempts of a rate-limited queue start (are claimed) in one window.

    Windows are aligned to the Unix epoch by the database clock; each attempt counts in the
    window of its claim (``mc_starts.claimed_at``, the job's ``started_at`` read as the
    handler starts). Only windows that lie wholly in a span when the rate was surely in force
    and unchanged are checked (see :func:`_in_force`). Attempts claimed but never begun by a
    handler (a worker killed, a job handed back) are not in the audit: the counts can only be
    low, never high, so a violation is never a false alarm. ``key_rates``: the same per task
    and payload key, for a rate per key.
    """
    claims: dict[str, list[Any]] = defaultdict(list)
    seen: set[tuple[int, Any]] = set()
    for began in final.starts.values():
        for s in began:
            if s.claimed_at is not None and (s.job_id, s.claimed_at) not in seen:
                seen.add((s.job_id, s.claimed_at))
                claims[s.queue].append(s)
    found = []
    for queue, started in claims.items():
        for what in ("rate", "key_rate"):
            for rate, since, until in _in_force(model, queue, what):
                limit, period = _windows(rate)
                counted: Counter[tuple[Any, ...]] = Counter()
                ids: dict[tuple[Any, ...], list[int]] = defaultdict(list)
                for s in started:
                    # As the claim computes it, exactly: whole periods since the epoch.
                    window = EPOCH + (s.claimed_at - EPOCH) // period * period
                    if window < since or window + period > until:
                        continue
                    group = (window,) if what == "rate" else (window, s.task, s.key)
                    counted[group] += 1
                    ids[group].append(s.job_id)
                name = "rate windows" if what == "rate" else "key rate windows"
                model.checked[name] = model.checked.get(name, 0) + len(counted)
                for group, n in counted.items():
                    if n > limit:
                        at = group[0]
                        found.append(
                            Violation(
                                "rates" if what == "rate" else "key_rates",
                                tuple(ids[group]),
                                f"queue {queue} {' '.join(map(str, group[1:]))}: {n} starts in"
                                f" the window of {at} ({rate}, in force unchanged from {since}"
                                f" to {until})",
                            )
                        )
    return found


def registry(model: Model, final: Final, pids: Iterable[int]) -> list[Violation]:
    """Each live worker process appears in the registry once."""
    seen = Counter(w.pid for w in final.workers)
    bad = {pid: seen[pid] for pid in pids if seen[pid] != 1}
    if not bad:
        return []
    names = [(w.name, w.pid, str(w.last_seen_at)) for w in final.workers]
    return [Violation("registry", (), f"live worker pids seen {bad} times; registry {names}")]


FINAL_CHECKS: tuple[Callable[[Model, Final], list[Violation]], ...] = (
    terminal,
    nothing_lost,
    effects_once,
    error_callbacks,
    attempts_once,
    session_usable,
    kept_results,
    dependency_order,
    cancels_honoured,
    rates,
    attempt_history,
    misfits_failed,
    plans_followed,
    hard_limits,
    batch_form,
)


def at_quiescence(model: Model, final: Final, pids: Iterable[int]) -> list[Violation]:
    # What engine enqueues left beyond what they returned joins the model first.
    found = adopt(model, final)
    found += [v for check in FINAL_CHECKS for v in check(model, final)]
    return found + registry(model, final, pids)


def settled(conn: sa.Connection, ids: list[int]) -> list[tuple[int, str]]:
    """The jobs among ``ids`` that have not ended yet, with their status."""
    return [
        (r.id, r.status)
        for r in conn.execute(
            sa.select(j.id, j.status).where(j.id.in_(ids), j.status.not_in(FINISHED_STATUSES))
        )
    ]


def earliest(rows: Iterable[datetime]) -> datetime | None:
    return min(rows, default=None)
