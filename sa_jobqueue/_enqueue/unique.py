"""Jobs with unique keys: insert, or find (and in replace and debounce modes update) the job
holding the key, again when that job finishes in between.

A unique job is inserted with ``ON CONFLICT DO NOTHING`` against the live-key index. When its
key is held, a guarded UPDATE of the holder follows (replace and debounce modes), and a lookup
of the holder when that did not apply. The holder may finish between those statements and
free the key: then the insert is tried again, up to :data:`UNIQUE_ROUNDS` rounds.
"""

from __future__ import annotations

from typing import Any, Final

from sqlalchemy import Connection, Insert

from .._driver import first_row
from .._sql import enqueue as enqueue_sql
from .._sql import unique_holders as holders_sql
from ..errors import JobQueueError
from .jobs import Enqueued, NewJobs

#: How many times a unique insert is tried again when the job holding its key finished between
#: the insert and the lookup. Each retry needs another transaction to enqueue and finish a job
#: with the same key within those two statements: rare, but four enqueuers racing a loop that
#: finishes the key's job as fast as it can lost ten rounds in a row once in a test run. Each
#: round is two short statements, so the bound is set far past any real churn.
UNIQUE_ROUNDS: Final = 100


def insert_unique_one(
    conn: Connection, new: NewJobs, params: dict[str, Any], wake_up: bool, sent: set[str]
) -> Enqueued:
    """Insert ``new``'s one job, whose key is set, with the job's ``params``; ``wake_up``: the
    insert carries its queue's NOTIFY (``sent``: the queues notified in the transaction)."""
    key = new.keys[0]
    params["unique_key"] = key
    options = new.options
    period = options.period_seconds
    if period is not None:
        params["unique_period"] = period
    traced = new.trace_context is not None
    insert = enqueue_sql.insert_job(
        options.schedule,
        wake_up,
        unique=True,
        traced=traced,
        backoff=options.backoff is not None,
        period=bool(period),
        labels=options.labelled,
    )
    update = None
    if options.unique_mode != "skip":
        update = holders_sql.update_held(options.unique_mode, options.schedule, traced=traced)
        replacing = {**new.params("b_"), "b_payload": params["payload"], "b_unique_key": key}
    lookup = {"task": new.task, "unique_keys": [key], "unique_period": period}
    for _ in range(UNIQUE_ROUNDS):
        row = first_row(conn, insert, params)
        if row is not None:
            sent.add(new.queue)  # the NOTIFY rode in RETURNING, which only an inserted row runs
            return Enqueued(row[0])
        if update is not None:
            held = conn.execute(update, replacing).first()
            if held is not None:
                if held[2] is not None:
                    sent.add(held[2])  # due now: the holder's queue was notified
                return Enqueued(held[0], created=False, updated=True)
            # Not queued (running, or finished in its window), or gone: look it up.
        found = conn.execute(holders_sql.find_unique(bool(period)), lookup).first()
        if found is not None:
            return Enqueued(found[1], created=False)
        # The live job that held the key finished between the two statements: insert again.
    raise _churn(new.task)


def insert_unique_many(
    conn: Connection, new: NewJobs, statement: Insert, bulk: dict[str, Any], sent: set[str]
) -> list[Enqueued]:
    """Insert ``new``'s jobs (some with keys) with ``statement`` and its ``bulk`` parameters;
    each payload's id, in order."""
    options = new.options
    replace = options.unique_mode != "skip"
    # One payload per key is sent, so one statement never holds a key twice: the first one in
    # skip mode (a later one would be skipped), the last one in replace and debounce modes (it
    # would replace the earlier ones, one call after another).
    sent_for: dict[str, int] = {}
    for i, key in enumerate(new.keys):
        if key is not None:
            if replace:
                sent_for[key] = i
            else:
                sent_for.setdefault(key, i)
    done: dict[int, Enqueued] = {}
    todo = [i for i, key in enumerate(new.keys) if key is None or sent_for[key] == i]
    period = bulk.get("b_unique_period")
    update = None
    if replace:
        traced = new.trace_context is not None
        update = holders_sql.update_held(options.unique_mode, options.schedule, traced, many=True)
    for _ in range(UNIQUE_ROUNDS):
        # Keys in one order (keyless payloads first, in theirs): two batches sharing keys then
        # take them one after another in the same order and wait for each other rather than
        # deadlock, as they could taking them in the order their payloads came in.
        todo.sort(key=lambda i: (new.keys[i] is not None, new.keys[i] or ""))
        rows = conn.execute(
            statement,
            {
                **bulk,
                "payloads": [new.payloads[i] for i in todo],
                "unique_keys": [new.keys[i] for i in todo],
            },
        ).all()
        # (id, unique_key), and a third column when the statement carries the NOTIFY.
        inserted = {row[1]: row[0] for row in rows if row[1] is not None}
        # Rows without a key are never skipped and come back in payload order, as in the
        # plain batch insert (INSERT ... SELECT FROM unnest keeps the array's order).
        keyless = iter([row[0] for row in rows if row[1] is None])
        skipped: list[int] = []
        for i in todo:
            key = new.keys[i]
            if key is None:
                done[i] = Enqueued(next(keyless))
            elif key in inserted:
                done[i] = Enqueued(inserted[key])
            else:
                skipped.append(i)
        if skipped and update is not None:
            held = conn.execute(
                update,
                {
                    **bulk,
                    "payloads": [new.payloads[i] for i in skipped],
                    "unique_keys": [new.keys[i] for i in skipped],
                },
            ).all()
            sent.update(row[2] for row in held if row[2] is not None)  # due now: notified
            updated = {row[1]: row[0] for row in held}
            left = []
            for i in skipped:
                key = new.keys[i]
                if key in updated:
                    done[i] = Enqueued(updated[key], created=False, updated=True)
                else:
                    left.append(i)
            skipped = left
        if not skipped:
            break
        live: dict[str, int] = {}
        for key, job_id in conn.execute(
            holders_sql.find_unique(period is not None),
            {
                "task": new.task,
                "unique_keys": [new.keys[i] for i in skipped],
                "unique_period": period,
            },
        ):
            live.setdefault(key, job_id)  # a key's first row is its holder (see find_unique)
        todo = []
        for i in skipped:
            key = new.keys[i]
            if key is not None and key in live:
                done[i] = Enqueued(live[key], created=False)
            else:
                todo.append(i)  # its live job finished between the two statements
        if not todo:
            break
    else:
        raise _churn(new.task)
    # Each payload gets its key's job. The first payload of a key gets what happened to it;
    # a later one was not added, and in replace and debounce modes it replaced the earlier
    # payload of a job that is (still) queued, as one call after another would have.
    ids: list[Enqueued] = []
    seen: set[str] = set()
    for i, key in enumerate(new.keys):
        if key is None:
            ids.append(done[i])
            continue
        job = done[sent_for[key]]
        if key not in seen:
            seen.add(key)
            ids.append(job)
        else:
            ids.append(
                Enqueued(job, created=False, updated=replace and (job.created or job.updated))
            )
    return ids


def _churn(task: str) -> JobQueueError:
    return JobQueueError(
        f"task {task!r}: the live job holding the unique key finished {UNIQUE_ROUNDS} times"
        " between the insert and the lookup; nothing was added"
    )
