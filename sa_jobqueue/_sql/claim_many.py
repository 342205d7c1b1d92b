"""The claim over many queues: one statement for every unlimited queue a lane serves.

A lane that serves many queues (a list, a pattern such as ``tenant-*``, or every queue) claims
with :func:`claim_many` instead of one :func:`.claiming.claim` per queue: an idle worker then
costs one statement per poll whatever the number of queues, and a drain of many small queues
does not pay a round trip per queue. Queues with a limit (a pause, a cap, a rate) are left out
here and claimed one by one through ``claim_limits``, as before: there are few of them.

The statement, CTE by CTE, in the order it runs:

``walk``
    The distinct queues holding due jobs (queued, or running on an expired lease), in name
    order from just past ``:after_queue``: a recursive "loose index scan" of the claim index,
    one step per queue however many jobs it holds, and lazy: it goes only as far as ``ready``
    asks.
``ready``
    Of those, up to ``:limit`` queues the lane serves (of ``:queues``, or ``LIKE ANY(:patterns)``)
    and that have no pause or limit; ``:near``, the listed names the walk reaches first, tells
    most of them without the whole list being read.
``candidates``
    From each ready queue its first due jobs in claim order, an even share of ``:limit``
    (rounded up), each numbered by its turn within its queue.
``picked``
    The first ``:limit`` candidates by (turn, queue), round-robin between the queues, locked
    with SKIP LOCKED; a row another claim took meanwhile fails the re-check and is skipped.

The fairness this gives is the one ``docs/how-to/flow-control.md`` states.
"""

from __future__ import annotations

from functools import cache

from sqlalchemy import (
    ARRAY,
    ColumnElement,
    Integer,
    Select,
    Text,
    Update,
    and_,
    bindparam,
    func,
    literal_column,
    or_,
    select,
)

from ..models import claimable, jobs_table, queues_table
from .claiming import in_claim_order, picked_columns, start_picked

j = jobs_table.c
q = queues_table.c


def held_back() -> Select[tuple[str]]:
    """The queues with a settings row that sends their claims elsewhere: a pause, or a limit
    (claimed by ``claim_limits``)."""
    return select(q.queue).where(
        or_(
            q.paused_at.is_not(None),
            q.concurrency.is_not(None),
            q.rate_limit.is_not(None),
            q.key_field.is_not(None),
        )
    )


@cache
def claim_many() -> Update:
    """Claim up to ``:limit`` due jobs for ``:worker`` from the unlimited queues a lane serves,
    round-robin between them, starting past ``:after_queue`` (``''``: from the first).

    Served: a queue of ``:queues`` (names, comma-separated) or one ``LIKE ANY(:patterns)``
    (SQL LIKE patterns, escaped by the caller). ``:near`` is a hint, some of ``:queues`` with a
    comma before and after each (``,a,b,``; ``,`` for none), best the names just past
    ``:after_queue``: the queues found in it are not looked up in ``:queues``, which is then
    read only if the walk meets another. Eligible rows are those
    :func:`.claiming.claim` takes, expired leases included, each started as it starts them.
    Each returned row also carries ``ready_queues``, how many queues had due jobs (at most
    ``:limit``), and ``last_queue``, the last of them in name order: where the next claim
    starts when the walk was cut short.

    What it does not do: honour priority across queues (each queue's jobs go in claim order,
    the queues take turns), or claim from a queue with a pause or a limit.
    """
    limit = bindparam("limit", type_=Integer)

    # The walk: each step finds the next queue name with a due job, one descent of the claim
    # index past the previous queue and then along it to the first due entry. A queue's due
    # jobs cost one step however many there are; what a step reads along the index is the
    # entries of jobs not due yet (running, or scheduled later) between two due ones, which
    # the plain claim of such a queue reads too. ``queue`` alone is selected and ordered, a
    # prefix of the index: no step sorts or reads the table.
    def next_due(past: ColumnElement[str]) -> Select[tuple[str]]:
        return (
            select(j.queue)
            .where(claimable(), j.queue > past, j.visible_at <= func.now())
            .order_by(j.queue)
            .limit(1)
        )

    walk = next_due(bindparam("after_queue", type_=Text)).cte("walk", recursive=True)
    step = next_due(walk.c.queue).scalar_subquery()
    walk = walk.union_all(select(step).where(walk.c.queue.is_not(None)))
    # Whether the lane serves a walked queue: three tests, cheapest first, each reached only
    # when those before it said no (PostgreSQL evaluates an OR's arms in order and stops at
    # the first true one; the planner does not reorder them).
    #
    # 1. ``:near``: the listed names the walk reaches first, the next few past ``:after_queue``
    #    as the caller sorts them, comma-separated with a comma at each end. A queue is one of
    #    them if ``,queue,`` is in that text: a search of a few kB that finds the next names
    #    near its start, since the walk goes in name order. It answers every step of a drain
    #    of listed queues, where each name the walk reaches has due jobs. A queue name has no
    #    comma, but a row written by hand might: such a name could span two listed ones, so
    #    it never matches here (the full set below still tells).
    # 2. ``LIKE ANY(:patterns)``.
    # 3. ``:queues``: every listed name, comma-separated, as a set hashed once per claim, and
    #    only if a step gets this far (a hashed subplan is built at its first use): a walk
    #    that steps over a queue the lane does not serve, or past ``:near``. Built at every
    #    claim, it was what a drain of 10,000 listed queues paid on top of a pattern's: about
    #    5 ms per claim on a busy 2-core machine (splitting the text and hashing each name),
    #    1.74 times the one-queue drain against 1.29 (bench/runs/2026-11-27-many-queues.txt).
    #    ``= ANY(:queues)`` instead would be a linear search of the array
    #    for each queue walked (a generic plan never hashes it), and a list of 10,000 strings
    #    took the driver and the server about ten times as long to send and read as the one
    #    string of them.
    #
    # ``:near`` only ever says yes for a name of ``:queues`` (the caller cuts it from them), so
    # what it holds matters for speed only: the lane serves a queue if and only if
    # ``:queues`` or ``:patterns`` name it, as before.
    comma = literal_column("','", type_=Text)
    near = bindparam("near", type_=Text)
    listed = bindparam("queues", type_=Text)
    # The delimiter is a sub-select, not a constant: with constants alone (each bound value
    # is one in a custom plan, the kind these claims get) the planner splits the whole list
    # while planning, at every claim, whether or not the set is then used (about 0.6 ms for
    # 10,000 names); a sub-select is only evaluated when the set is built.
    names = select(func.unnest(func.string_to_array(listed, select(comma).scalar_subquery())))
    served = or_(
        and_(
            func.strpos(walk.c.queue, comma) == 0,
            func.strpos(near, comma + walk.c.queue + comma) > 0,
        ),
        walk.c.queue.like(func.any(bindparam("patterns", type_=ARRAY(Text)))),
        walk.c.queue.in_(names),
    )
    ready = (
        select(walk.c.queue)
        # Filters only, no join: the walk is read in its order and only as far as the LIMIT
        # needs. ``NOT EXISTS`` here became an anti-join, and the planner was free to hash the
        # whole walk (every queue with due jobs) and return the ready queues in any order;
        # ``NOT IN`` is never turned into a join, and runs as one hashed set per claim.
        .where(walk.c.queue.is_not(None), served, walk.c.queue.not_in(held_back()))
        .limit(limit)
        .cte("ready")
        .prefix_with("MATERIALIZED")
    )
    # An even share of the limit for each ready queue, rounded up: with more ready queues than
    # the limit, one job each; with one, the whole limit. Integer division of positive ints.
    count = func.greatest(select(func.count()).select_from(ready).scalar_subquery(), 1)
    share = (limit + count - 1) // count
    order = in_claim_order(j)
    turn = func.row_number().over(order_by=order).label("turn")
    firsts = (
        select(j.id, j.queue, turn)
        .where(claimable(), j.queue == ready.c.queue, j.visible_at <= func.now())
        .order_by(*order)
        .limit(share)
        .lateral("firsts")
    )
    candidates = select(firsts.c.id, firsts.c.queue, firsts.c.turn).select_from(
        ready.join(firsts, literal_column("true"))
    )
    ranked = candidates.subquery("candidates")
    chosen_ids = (
        select(ranked.c.id).order_by(ranked.c.turn, ranked.c.queue).limit(limit).scalar_subquery()
    )
    # Locked by primary key, after the choice: the walk and the shares lock nothing, so no
    # row is held that the claim does not take. The re-check (claimable, due) drops a row
    # another claim started between this statement's snapshot and its lock.
    picked = (
        select(*picked_columns())
        .where(
            j.id == func.any(func.array(chosen_ids)),
            claimable(),
            j.visible_at <= func.now(),
        )
        .with_for_update(skip_locked=True)
        .cte("picked")
        .prefix_with("MATERIALIZED")
    )
    claimed = start_picked(picked)
    ready_count = select(func.count()).select_from(ready).scalar_subquery()
    last = select(func.max(ready.c.queue)).scalar_subquery()
    return claimed.returning(ready_count.label("ready_queues"), last.label("last_queue"))
