"""Chains, groups and chords of :class:`~sa_jobqueue.workflows.Call` s, as works for the
Enqueuer's shells: each a function of the Connection to write through.

A call's options are checked when its turn comes (after the calls before it were sent), as
each was one enqueue of its own.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

from sqlalchemy import Connection

from ..workflows import (
    Call,
    Dependency,
    OnFailure,
    check_call_options,
    check_dependencies,
)
from .enqueuer import Enqueuer
from .inserting import insert_many
from .jobs import Enqueued


def chain_of(
    enqueuer: Enqueuer,
    calls: Sequence[Call],
    depends_on: Sequence[int | Dependency] | None,
    on_failure: OnFailure,
) -> Callable[[Connection], list[Enqueued]]:
    """``calls``, each waiting for the one before (the first for ``depends_on``)."""
    first_edges = check_dependencies(depends_on)

    def chain(conn: Connection) -> list[Enqueued]:
        ids: list[Enqueued] = []
        edges = first_edges
        for call in calls:
            (job_id,) = _enqueue_calls(enqueuer, conn, [call], edges, frozenset(ids[-1:]))
            ids.append(job_id)
            edges = [Dependency(job_id, on_failure)]
        return ids

    return chain


def group_of(enqueuer: Enqueuer, calls: Sequence[Call]) -> Callable[[Connection], list[Enqueued]]:
    """``calls`` side by side; calls of one task with the same options go in together."""

    def group(conn: Connection) -> list[Enqueued]:
        ids: list[Enqueued] = []
        for _, run in itertools.groupby(calls, key=_batch_key):
            ids += _enqueue_calls(enqueuer, conn, list(run), [], frozenset())
        return ids

    return group


def chord_of(
    enqueuer: Enqueuer, calls: Sequence[Call], callback: Call, on_failure: OnFailure
) -> Callable[[Connection], tuple[list[Enqueued], Enqueued]]:
    """A group of ``calls`` and a ``callback`` that waits for all of them."""
    group = group_of(enqueuer, calls)

    def chord(conn: Connection) -> tuple[list[Enqueued], Enqueued]:
        members = group(conn)
        edges = [Dependency(job_id, on_failure) for job_id in members]
        (last,) = _enqueue_calls(enqueuer, conn, [callback], edges, frozenset(members))
        return members, last

    return chord


def _enqueue_calls(
    enqueuer: Enqueuer,
    conn: Connection,
    calls: list[Call],
    edges: list[Dependency],
    new: frozenset[int],
) -> list[Enqueued]:
    """Enqueue ``calls`` (one task, the same options) waiting for ``edges``; ``new``: the
    dependencies enqueued in this transaction."""
    first = calls[0]
    options = check_call_options(first.options)
    payloads = [call.payload for call in calls]
    return enqueuer.work(first.task, payloads, None, options, insert_many, edges, new)(conn)


def _batch_key(call: Call) -> tuple[str, str]:
    """Calls that can go in together: the same task and the same options."""
    task = call.task if isinstance(call.task, str) else call.task.name
    return task, repr(sorted(call.options.items()))
