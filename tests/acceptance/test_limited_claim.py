"""The limited claim across committed transactions and concurrent sessions, in this process.

The claims are the worker's own (``LaneClaimer._claim_limited``: ``claim_limits.claim_limited``,
one statement), each claimer on a connection of its own; jobs finish through the worker's
completion statement. No worker runs: the tests decide when jobs end. Real workers with
limits are in tests/acceptance/test_queue_limits_workers.py.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from sa_jobqueue._sql import claim_limits, leases
from sa_jobqueue._sql.fence import held_many
from sa_jobqueue.database import HeldConnection
from sa_jobqueue.models import RUNNING, jobs_table, key_starts_table, queues_table
from sa_jobqueue.ops import set_queue_concurrency, set_queue_key_rate, set_queue_rate
from sa_jobqueue.worker._claimer import LaneClaimer
from sa_jobqueue.worker._upkeep import Pruner
from tests.helpers.jobs import statuses
from tests.helpers.limited_claims import (
    Checked,
    add_due,
    claim_limited,
    finish,
    limited_claimer,
    live,
)
from tests.helpers.waiting import wait_for

j = jobs_table.c
q = queues_table.c
QUEUE = "capped"


@pytest.fixture
def held(engine: sa.Engine) -> Iterator[Callable[[], HeldConnection]]:
    """Makes the worker's autocommit claiming connections; closes them after."""
    made: list[HeldConnection] = []

    def make() -> HeldConnection:
        made.append(HeldConnection(engine.execution_options(isolation_level="AUTOCOMMIT")))
        return made[-1]

    yield make
    for conn in made:
        conn.close()


def ids(jobs: list[Any]) -> list[int]:
    return [job.id for job in jobs]


def running_ids(engine: sa.Engine, queue: str = QUEUE) -> list[Any]:
    with engine.connect() as conn:
        query = sa.select(j.id, j.attempts).where(j.queue == queue, j.status == RUNNING)
        return list(conn.execute(query.order_by(j.id)).all())


def test_a_cap_holds_across_claimers_and_commits(
    engine: sa.Engine, held: Callable[[], HeldConnection]
) -> None:
    with engine.begin() as conn:
        add_due(conn, QUEUE, 10)
        set_queue_concurrency(conn, QUEUE, 3)
    one, two = limited_claimer(held(), "one"), limited_claimer(held(), "two")
    first = claim_limited(one, QUEUE, 2)
    assert len(first) == 2
    assert len(claim_limited(two, QUEUE, 10)) == 1
    assert one._claim_limited(QUEUE, 10) == ([], True)
    assert claim_limited(two, QUEUE, 10) == []
    with engine.begin() as conn:
        assert finish(conn, first[:1]) == 1
    assert len(claim_limited(two, QUEUE, 10)) == 1
    assert claim_limited(one, QUEUE, 10) == []
    with engine.connect() as conn:
        assert live(conn, QUEUE) == 3
        assert statuses(conn, queue=QUEUE) == Counter(running=3, succeeded=1, queued=6)


def test_an_expired_lease_is_not_renewed_once_its_slot_may_have_gone(
    engine: sa.Engine, held: Callable[[], HeldConnection]
) -> None:
    """A stalled worker's heartbeat, when it wakes, must not renew a lease that expired: the
    limited claim counted that job's slot free and gave it to another job meanwhile. Its
    renewal finds no row for it, not even a locked one (the worker then treats it as lost)."""
    with engine.begin() as conn:
        add_due(conn, QUEUE, 1)
        set_queue_concurrency(conn, QUEUE, 1)
        conn.execute(sa.update(jobs_table).values(lease=timedelta(milliseconds=300)))
    claimer = limited_claimer(held(), "stalled")
    (first,) = claim_limited(claimer, QUEUE, 1)
    # Enqueued while the first job's lease is live: due before that lease expires, so the next
    # claim takes it (it comes first in claim order), not the expired job.
    with engine.begin() as conn:
        add_due(conn, QUEUE, 1)
    # Autocommit: each poll is a transaction of its own, with its own now().
    with engine.execution_options(isolation_level="AUTOCOMMIT").connect() as conn:
        expired = sa.select(j.visible_at <= sa.func.now()).where(j.id == first.id)
        wait_for(lambda: conn.execute(expired).scalar_one(), timeout=10)
    (second,) = claim_limited(limited_claimer(held(), "other"), QUEUE, 1)
    assert second.id != first.id

    renewal = held_many([(first.id, first.attempts)])
    with engine.connect() as conn, conn.begin():
        renewed = conn.execute(leases.extend_leases(), {**renewal, "progress": {}}).all()
        still = conn.execute(leases.still_held(), renewal).scalars().all()
    with engine.connect() as conn:
        assert live(conn, QUEUE) == 1
    assert (renewed, still) == ([], [])


# -- 4. exactness under concurrency --------------------------------------------------------------

CAP = 3
JOBS = 150
CLAIMERS = 8
FINISHERS = 2


class Hammer:
    """Claimers, finishers and a sampler on one capped queue, each thread on its connection.

    ``handoff``: the finishers complete jobs as a worker's completer does for jobs holding
    slots, with the completing limited claim, which also claims as many jobs as it completed
    (checked under the queue's lock like the claimers')."""

    def __init__(self, engine: sa.Engine, *, handoff: bool = False) -> None:
        self.engine = engine
        self.handoff = handoff
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.errors: list[BaseException] = []
        self.claimed: list[int] = []
        self.claims = 0
        self.handed_off = 0
        self.at_cap = 0
        self.samples: list[int] = []
        self.violations: list[str] = []
        self.threads: list[threading.Thread] = []

    def check(self, conn: sa.Connection, rows: list[Any]) -> None:
        """In the claim's transaction, after its statement, with the queue's row locked: the
        jobs holding slots are at most the cap, all recorded as holders, this claim's too."""
        running = set(
            conn.execute(
                sa.select(j.id).where(
                    j.queue == QUEUE, j.status == RUNNING, j.visible_at > sa.func.now()
                )
            ).scalars()
        )
        holders = set(conn.execute(sa.select(q.holders).where(q.queue == QUEUE)).scalar_one())
        claimed = {row.id for row in rows if row.id is not None}
        if len(running) > CAP:
            self.violations.append(f"{len(running)} run after a claim: {sorted(running)}")
        if not running <= holders or not claimed <= running:
            self.violations.append(f"running {running}, holders {holders}, claimed {claimed}")

    def guarded(self, loop: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                while not self.stop.is_set():
                    loop()
            except BaseException as exc:
                self.errors.append(exc)
                self.stop.set()

        return run

    def closing(self, on: Checked, loop: Callable[[], None]) -> Callable[[], None]:
        """:meth:`guarded`, closing ``on``'s connection when the thread ends."""

        def run() -> None:
            try:
                self.guarded(loop)()
            finally:
                on.close()

        return run

    def claimer(self, n: int) -> Callable[[], None]:
        on = Checked(self.engine, self.check)
        claimer = limited_claimer(on, f"claimer-{n}")

        def once() -> None:
            jobs, at_cap = claimer._claim_limited(QUEUE, random.randint(1, 4))
            with self.lock:
                self.claimed.extend(ids(jobs))
                self.claims += 1
                self.at_cap += at_cap

        return self.closing(on, once)

    def finisher(self) -> Callable[[], None]:
        on = Checked(self.engine, self.check)

        def once() -> None:
            with self.engine.begin() as conn:
                query = sa.select(j.id, j.attempts).where(j.queue == QUEUE, j.status == RUNNING)
                rows = conn.execute(query.order_by(sa.func.random()).limit(2)).all()
                if not rows or random.random() < 0.5:
                    return
                if not self.handoff:
                    finish(conn, list(rows))
                    return
            # Sometimes with a stale attempt beside: it completes nothing and frees no slot.
            batch = [
                (r.id, r.attempts - (n == 1 and random.random() < 0.3)) for n, r in enumerate(rows)
            ]
            params = {
                "from_queue": QUEUE,
                "limit": len(batch),
                "worker": "handoff",
                "job_ids": [job_id for job_id, _ in batch],
                "attempt_list": [attempt for _, attempt in batch],
            }
            statement = claim_limits.claim_limited(keyed=False, completing=True)
            result = on.rows(statement, params)
            with self.lock:
                taken = [row.id for row in result if row.id is not None]
                self.claimed.extend(taken)
                self.handed_off += len(taken)

        return self.closing(on, once)

    def sampler(self) -> Callable[[], None]:
        def once() -> None:
            with self.engine.connect() as conn:
                n = live(conn, QUEUE)
            with self.lock:
                self.samples.append(n)

        return self.guarded(once)

    def run(self) -> None:
        """Run all threads until every job has succeeded (or a thread failed)."""
        targets = [self.claimer(n) for n in range(CLAIMERS)]
        targets += [self.finisher() for _ in range(FINISHERS)] + [self.sampler()]
        self.threads = [threading.Thread(target=t) for t in targets]
        for thread in self.threads:
            thread.start()
        try:
            wait_for(
                lambda: (
                    self.stop.is_set()
                    or statuses(self.engine, queue=QUEUE) == Counter(succeeded=JOBS)
                ),
                timeout=90,
                interval=0.1,
            )
        finally:
            self.stop.set()
            for thread in self.threads:
                thread.join(30)
        assert not any(thread.is_alive() for thread in self.threads)


@pytest.mark.parametrize(
    ("recorded", "handoff"),
    [(False, False), (True, False), (True, True)],
    ids=["recounting", "recorded-holders", "completions-claiming"],
)
def test_eight_claimers_never_run_more_than_the_cap(
    engine: sa.Engine, recorded: bool, handoff: bool
) -> None:
    """Eight claimers on a cap of 3, jobs finishing at random meanwhile: no claim ever leaves
    more than 3 running (checked inside each claim, before it commits, and by sampling from
    another session), and every job runs exactly once. ``recorded``: the cap's recount
    period is over from the start, so every claim counts the recorded holders. ``handoff``:
    the jobs finish through the completing claim, which claims their successors too."""
    with engine.begin() as conn:
        add_due(conn, QUEUE, JOBS)
        set_queue_concurrency(conn, QUEUE, CAP)
        if recorded:
            conn.execute(
                sa.update(queues_table).values(
                    holders=[], recount_until=sa.func.now() - sa.text("interval '1 minute'")
                )
            )
    hammer = Hammer(engine, handoff=handoff)
    hammer.run()
    assert hammer.errors == []
    assert (hammer.handed_off > 0) == handoff
    assert hammer.violations == []
    assert max(hammer.samples) <= CAP
    # It can fail: the cap was reached, claims were cut short by it, claimers raced.
    assert max(hammer.samples) == CAP
    assert hammer.at_cap > 0
    assert hammer.claims > JOBS / 4
    with engine.connect() as conn:
        all_ids = set(conn.execute(sa.select(j.id).where(j.queue == QUEUE)).scalars())
        attempts = Counter(conn.execute(sa.select(j.attempts).where(j.queue == QUEUE)).scalars())
    counted = Counter(hammer.claimed)
    assert set(counted) == all_ids
    assert set(counted.values()) == {1}
    assert attempts == Counter({1: JOBS})


# -- 5. rate -------------------------------------------------------------------------------------


def db_second(engine: sa.Engine) -> int:
    """The database clock's current whole second (a new transaction's ``now()``)."""
    with engine.connect() as conn:
        query = sa.select(sa.func.floor(sa.func.extract("epoch", sa.func.now())))
        return int(conn.execute(query).scalar_one())


def next_second(engine: sa.Engine, after: int) -> int:
    """Poll the database clock until it is past the second ``after``; the second it is in."""
    return wait_for(lambda: (s := db_second(engine)) > after and s, timeout=5, interval=0.01)


def starts_per_second(engine: sa.Engine, job_ids: list[int]) -> Counter[int]:
    with engine.connect() as conn:
        second = sa.func.floor(sa.func.extract("epoch", j.started_at))
        rows = conn.execute(sa.select(second).where(j.id.in_(job_ids))).scalars()
        return Counter(int(s) for s in rows)


def until_used_up(claimer: LaneClaimer, queue: str) -> list[int]:
    """Limited claims asking for varied counts, until one is refused by the rate."""
    taken: list[int] = []
    claimer.not_before.clear()
    for ask in (3, 1, 4, 10, 2, 10, 1, 7, 10, 10):
        jobs = ids(claim_limited(claimer, queue, ask))
        taken += jobs
        if not jobs:
            assert queue in claimer.not_before  # refused by the rate, not for want of jobs
            return taken
    raise AssertionError(f"the rate never stopped the claims: {taken}")


def test_a_rate_of_5_per_second_starts_5_per_window(
    engine: sa.Engine, held: Callable[[], HeldConnection]
) -> None:
    with engine.begin() as conn:
        add_due(conn, "rated", 40)
        set_queue_rate(conn, "rated", "5/s")
    claimer = limited_claimer(held(), "rated-claimer")
    next_second(engine, db_second(engine))  # start near the beginning of a window
    taken = until_used_up(claimer, "rated")
    waits = claimer.not_before["rated"] - time.monotonic()
    assert 0 < waits <= 1.0
    per_window = starts_per_second(engine, taken)
    # The window the refused claim ran in had exactly 5 starts, whatever each claim asked;
    # no window had more (a stall could spread the claims over two).
    assert max(per_window.values()) == 5, per_window
    assert len(taken) in (5, 10), per_window

    # The lock function alone, while the window is used up: no starts left, and the wait
    # until the next window is within one period.
    state = wait_for(lambda: _used_up_state(engine, claimer, "rated"), timeout=5)
    assert state is not None
    left, wait = state
    assert left <= 0, state
    assert 0 <= wait <= 1, state

    # The next window (by the database clock) lets 5 more start, in one claim asking for 10.
    last = max(starts_per_second(engine, taken))
    next_second(engine, last)
    more = ids(claim_limited(claimer, "rated", 10))
    assert len(more) == 5
    assert list(starts_per_second(engine, more).values()) == [5]


def _used_up_state(engine: sa.Engine, claimer: LaneClaimer, queue: str) -> tuple[int, float] | None:
    """Use up the current window, then read ``sa_jobqueue_lock_queue``'s starts left and wait;
    None if the window moved on in between (read again)."""
    until_used_up(claimer, queue)
    with engine.connect() as conn, conn.begin():
        row = conn.execute(
            sa.text(
                "SELECT rate_left, window_start, rate_wait FROM sa_jobqueue_lock_queue(:queue)"
            ),
            {"queue": queue},
        ).one()
        left, window, wait = row
        now = conn.execute(sa.select(sa.func.now())).scalar_one()
    if now.replace(microsecond=0) != window:  # the window moved on in between: read again
        return None
    return int(left), float(wait)


# -- 6. rate per key -----------------------------------------------------------------------------

KEYED = "per-customer"


def starts_per_key_and_second(engine: sa.Engine, job_ids: list[int]) -> Counter[tuple[str, int]]:
    """The starts of each (customer, second of the database clock) among ``job_ids``."""
    with engine.connect() as conn:
        second = sa.func.floor(sa.func.extract("epoch", j.started_at))
        query = sa.select(j.payload["customer"].astext, second).where(j.id.in_(job_ids))
        return Counter((key, int(s)) for key, s in conn.execute(query))


def starts_per_key(engine: sa.Engine, jobs: list[Any]) -> Counter[str]:
    """How many of ``jobs`` each customer started (None: jobs without one)."""
    starts = starts_per_key_and_second(engine, ids(jobs))
    return Counter(key for key, _ in starts.elements())


def add_for(conn: sa.Connection, queue: str, customer: str, n: int) -> None:
    rows = [{"queue": queue, "task": "work", "payload": {"customer": customer}}] * n
    conn.execute(sa.insert(jobs_table), rows)


def test_a_rate_per_key_holds_each_key_alone(
    engine: sa.Engine, held: Callable[[], HeldConnection]
) -> None:
    """3 per key in a window (one long enough never to end here): each key's fourth job waits,
    whatever is asked; jobs without the key, and a new key's, start meanwhile."""
    with engine.begin() as conn:
        add_due(conn, KEYED, 40, keys=4)  # 10 each for c0 .. c3
        add_due(conn, KEYED, 2)  # no key: not limited by key
        set_queue_key_rate(conn, KEYED, "3/1000d", key="customer")
    claimer = limited_claimer(held(), "keyed-claimer", keyed=[KEYED])
    first = claim_limited(claimer, KEYED, 100)
    assert starts_per_key(engine, first) == {"c0": 3, "c1": 3, "c2": 3, "c3": 3, None: 2}

    jobs, held_back = claimer._claim_limited(KEYED, 100)
    assert (jobs, held_back) == ([], True)
    assert 0 < claimer.key_windows[KEYED] - time.monotonic() <= 1000 * 86400
    assert KEYED not in claimer.not_before  # the queue is still claimed from: its keys wait

    with engine.begin() as conn:
        add_for(conn, KEYED, "new", 5)
    assert starts_per_key(engine, claim_limited(claimer, KEYED, 100)) == {"new": 3}
    with engine.connect() as conn:
        counted = dict(
            conn.execute(
                sa.select(key_starts_table.c.key, key_starts_table.c.starts).where(
                    key_starts_table.c.queue == KEYED
                )
            ).all()
        )
    assert counted == {"c0": 3, "c1": 3, "c2": 3, "c3": 3, "new": 3}


def test_a_rate_per_key_of_2_per_second_over_eight_claimers(
    engine: sa.Engine, held: Callable[[], HeldConnection]
) -> None:
    """Eight claimers at once, asking for 1 to 4 jobs each time, on 2 per second per key, while
    jobs keep arriving ahead of the others (a higher priority), so a claim that waited for the
    queue's lock ranks jobs its snapshot never saw started: no key ever starts more than 2 jobs
    in a second of the database clock, and no job is claimed twice."""
    keys = 4
    with engine.begin() as conn:
        add_due(conn, KEYED, keys * 20, keys=keys)
        set_queue_key_rate(conn, KEYED, "2/s", key="customer")
    claimed: list[int] = []
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[BaseException] = []

    def guarded(loop: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                while not stop.is_set():
                    loop()
            except BaseException as exc:
                errors.append(exc)

        return run

    def claimer(n: int) -> Callable[[], None]:
        claimer = limited_claimer(held(), f"claimer-{n}", keyed=[KEYED])

        def once() -> None:
            taken = ids(claim_limited(claimer, KEYED, random.randint(1, 4)))
            with lock:
                claimed.extend(taken)
            stop.wait(0.002)

        return guarded(once)

    priority = iter(range(-1, -30000, -1))

    def enqueue() -> None:
        with engine.begin() as conn:
            rows = [
                {
                    "queue": KEYED,
                    "task": "work",
                    "priority": next(priority),
                    "payload": {"customer": f"c{k}"},
                }
                for k in range(keys)
            ]
            conn.execute(sa.insert(jobs_table), rows)
        stop.wait(0.01)

    threads = [threading.Thread(target=claimer(n)) for n in range(CLAIMERS)]
    threads.append(threading.Thread(target=guarded(enqueue)))
    started = db_second(engine)
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: errors or db_second(engine) >= started + 4, timeout=30, interval=0.05)
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
    assert errors == []
    assert len(claimed) == len(set(claimed))
    starts = starts_per_key_and_second(engine, claimed)
    assert max(starts.values()) == 2, starts
    # Each key started jobs in each of the 3 seconds wholly inside the run.
    whole = range(started + 1, started + 4)
    assert {(f"c{k}", s) for k in range(keys) for s in whole} <= set(starts), starts


def test_pruning_deletes_counts_per_key_of_windows_that_are_over(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        set_queue_key_rate(conn, KEYED, "3/h", key="customer")
        set_queue_rate(conn, "no-keys", "3/h")
        hour = sa.func.date_trunc("hour", sa.func.now())
        rows = [
            (KEYED, "current", hour),
            (KEYED, "over", hour - sa.text("interval '1 hour'")),
            ("no-keys", "current", hour),
            ("gone", "current", hour),
        ]
        for queue, key, window in rows:
            conn.execute(
                sa.insert(key_starts_table).values(
                    queue=queue, task="work", key=key, window_start=window, starts=1
                )
            )
    assert Pruner(engine, timedelta(days=1), timedelta(seconds=1)).prune() == 0
    with engine.connect() as conn:
        left = conn.execute(sa.select(key_starts_table.c.queue, key_starts_table.c.key)).all()
    assert left == [(KEYED, "current")]
