"""A lane's claimer: asks each queue for the free slots, in rotation, against a fake connection."""

from __future__ import annotations

import logging
import threading
import time
from collections import namedtuple
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import pytest

from sa_jobqueue._sql import claim_many, claiming
from sa_jobqueue.worker import _claimer
from sa_jobqueue.worker._claimed import Claimed
from sa_jobqueue.worker._claimer import ClaimLoop, LaneClaimer
from sa_jobqueue.worker._lanes import Lane
from sa_jobqueue.worker._leases import LeaseTable


class ClaimRow(NamedTuple):
    """A claim's row as the worker reads it: by label. The columns are in another order than
    the claim's, with one it does not read first, so a read by position would fail."""

    settled: int
    created_at: datetime
    visible_at: datetime  # the claim position: priority, visible_at (before the claim), id
    priority: int
    backoff: None
    trace_context: None
    lease: timedelta
    max_attempts: int
    attempts: int
    status: str
    payload: str
    task: str
    queue: str
    id: int


class FakeConnection:
    """Answers each claim with up to ``limit`` of the jobs waiting in the queue asked."""

    def __init__(self, waiting: dict[str, int], status: str = "running") -> None:
        self.waiting = waiting
        self.status = status
        self.asked: list[tuple[str, int]] = []
        #: Per claim: None from the head, else the position it started past.
        self.started_past: list[tuple[Any, ...] | None] = []
        self.next_id = 1

    def rows(
        self, statement: Any, params: dict[str, Any], *, as_text: bool = False
    ) -> list[ClaimRow]:
        queue, limit = params["from_queue"], params["limit"]
        self.asked.append((queue, limit))
        if statement is claiming.claim_after():
            after = (params["after_priority"], params["after_visible_at"], params["after_id"])
            self.started_past.append(after)
        else:
            assert statement is claiming.claim()
            self.started_past.append(None)
        n = min(limit, self.waiting.get(queue, 0))
        self.waiting[queue] = self.waiting.get(queue, 0) - n
        rows = []
        for _ in range(n):
            rows.append(
                ClaimRow(
                    settled=0,
                    created_at=DUE,
                    visible_at=DUE,
                    priority=0,
                    backoff=None,
                    trace_context=None,
                    lease=timedelta(seconds=30),
                    max_attempts=5,
                    attempts=1,
                    status=self.status,
                    payload="null",
                    task="t",
                    queue=queue,
                    id=self.next_id,
                )
            )
            self.next_id += 1
        return rows


def claimer(lane: Lane, conn: FakeConnection) -> tuple[LaneClaimer, list[Claimed]]:
    submitted: list[Claimed] = []
    leases = LeaseTable()

    def submit(lane: Lane, job: Claimed) -> None:
        leases.hold(lane, job)
        submitted.append(job)

    return LaneClaimer(lane, conn, "w", leases, submit), submitted  # type: ignore[arg-type]


def finish(one: LaneClaimer, n: int | None = None) -> None:
    """``n`` of the lane's claimed jobs finish (all if None), as their threads would."""
    tickets = list(one._leases.tickets)
    for ticket in tickets if n is None else tickets[:n]:
        one._leases.let_go(ticket)


#: A many-queue claim's row: a claim row, and how far the walk got.
ManyRow = namedtuple("ManyRow", [*ClaimRow._fields, "ready_queues", "last_queue"])


class FakeManyConnection(FakeConnection):
    """Answers the many-queue claim as the statement does: the queues with jobs past
    ``after_queue``, up to ``limit`` of them, an even share each, round-robin."""

    def rows(self, statement: Any, params: dict[str, Any], *, as_text: bool = False) -> Any:
        assert statement is claim_many.claim_many()
        limit, after = params["limit"], params["after_queue"]
        self.asked.append((after, limit))
        ready = sorted(q for q, n in self.waiting.items() if q > after and n > 0)[:limit]
        if not ready:
            return []
        share = -(-limit // len(ready))
        taken = [(turn, q) for q in ready for turn in range(min(share, self.waiting[q]))]
        rows = []
        for _, queue in sorted(taken)[:limit]:
            self.waiting[queue] -= 1
            job = (
                FakeConnection({queue: 1}, self.status)
                .rows(claiming.claim(), {"from_queue": queue, "limit": 1})[0]
                ._replace(id=self.next_id)
            )
            self.next_id += 1
            rows.append(ManyRow(*job, len(ready), ready[-1]))
        return rows


def test_a_lane_of_many_queues_claims_them_in_one_statement_taking_turns() -> None:
    lane = Lane(["a", "b", "c"], 2, 0)  # capacity 2: fewer slots than queues with jobs
    conn = FakeManyConnection({"a": 1, "b": 5, "c": 1})
    one, submitted = claimer(lane, conn)
    assert one.claim()  # the slots ran out before every queue had its turn
    assert conn.asked == [("", 2)]
    assert [job.queue for job in submitted] == ["a", "b"]
    finish(one)
    conn.asked.clear()
    one.claim()  # the next claim starts past the last queue the walk reached
    assert conn.asked == [("b", 2)]
    assert [job.queue for job in submitted[2:]] == ["c"]
    finish(one)
    conn.asked.clear()
    one.claim()  # the walk reached the end: from the first again
    assert conn.asked == [("", 2)]
    assert [job.queue for job in submitted[3:]] == ["b", "b"]


def test_a_pattern_lane_claims_with_one_statement_even_when_idle() -> None:
    lane = Lane(["tenant-*"], 4, 0)
    conn = FakeManyConnection({})
    one, submitted = claimer(lane, conn)
    assert not one.claim()
    assert not one.claim()
    assert conn.asked == [("", 4), ("", 4)]
    assert submitted == []


def test_a_short_answer_means_nothing_more_is_waiting() -> None:
    lane = Lane(["a"], 4, 0)
    conn = FakeConnection({"a": 3})
    one, submitted = claimer(lane, conn)
    assert not one.claim()
    assert len(submitted) == 3
    assert not lane.saturated


def test_with_work_waiting_a_lane_claims_again_only_once_its_buffer_runs_low() -> None:
    lane = Lane(["a"], 4, 4)  # capacity 8, low water 6
    conn = FakeConnection({"a": 100})
    one, _ = claimer(lane, conn)
    assert one.claim()
    assert conn.asked == [("a", 8)]
    finish(one, 1)  # one job finished: a claim now would bring one job
    assert lane.held == 7
    assert one.claim()
    assert conn.asked == [("a", 8)]
    finish(one, 1)  # at low water the lease table wakes the loop
    assert (lane.held, lane.saturated) == (6, False)
    assert one.claim()
    assert conn.asked == [("a", 8), ("a", 2)]


def test_a_lane_that_emptied_its_queues_claims_whatever_room_it_has() -> None:
    lane = Lane(["a"], 4, 4)
    conn = FakeConnection({"a": 2})
    one, _ = claimer(lane, conn)
    assert not one.claim()
    conn.waiting["a"] = 5  # enqueued since: a NOTIFY or the poll claims it at once
    assert not one.claim()
    assert conn.asked == [("a", 8), ("a", 6)]


def test_a_job_that_is_no_longer_running_is_not_submitted() -> None:
    lane = Lane(["a"], 2, 0)
    one, submitted = claimer(lane, FakeConnection({"a": 1}, status="dead"))
    one.claim()
    assert submitted == []


DUE = datetime(2026, 1, 1, tzinfo=UTC)  # every fake row's visible_at before its claim


def test_after_a_full_claim_the_next_starts_past_the_last_row_it_took() -> None:
    lane = Lane(["a"], 3, 0)
    conn = FakeConnection({"a": 10})
    one, _ = claimer(lane, conn)
    assert one.claim()
    finish(one)
    assert one.claim()
    assert conn.started_past == [None, (0, DUE, 3)]


def test_a_short_claim_past_a_position_sends_the_next_claim_to_the_head_at_once() -> None:
    lane = Lane(["a"], 3, 0)
    conn = FakeConnection({"a": 4})
    one, _ = claimer(lane, conn)
    one.claim()
    finish(one)
    # One job past the position: not "nothing waiting", as the head may hold more.
    assert one.claim()
    finish(one)
    assert not one.claim()  # from the head, and short: nothing waiting
    assert conn.started_past == [None, (0, DUE, 3), None]


def test_a_lane_claims_from_the_head_again_once_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(_claimer.time, "monotonic", lambda: now[0])
    lane = Lane(["a"], 2, 0)
    conn = FakeConnection({"a": 100})
    one, _ = claimer(lane, conn)
    for step in (0.0, 0.5, 0.49, 0.02, 0.3):
        now[0] += step
        one.claim()
        finish(one)
    assert _claimer.HEAD_EVERY == 1.0
    assert conn.started_past == [None, (0, DUE, 2), (0, DUE, 4), None, (0, DUE, 8)]


class FakeLaneClaimer:
    """Answers each round from a script: whether more is probably waiting."""

    def __init__(self, lane: Lane, answers: list[bool | Exception]) -> None:
        self.lane = lane
        self.answers = answers
        self.rounds = 0

    def claim(self) -> bool:
        self.rounds += 1
        answer = self.answers.pop(0) if self.answers else False
        if isinstance(answer, Exception):
            raise answer
        return answer

    def next_window(self) -> float | None:
        return None


def every_round(_: object = None) -> float:
    """A ``between_rounds`` result: due again at once, so called before every round."""
    return 0.0


def test_a_burst_claims_until_a_round_finds_nothing_and_nothing_runs() -> None:
    lane = Lane(["a"], 1, 0)
    fake = FakeLaneClaimer(lane, [True, True, False, True])
    rounds: list[int] = []
    loop = ClaimLoop(
        [fake],  # type: ignore[list-item]
        LeaseTable(),
        poll_interval=timedelta(milliseconds=1),
        wake=threading.Event(),
        stopping=threading.Event(),
        between_rounds=lambda: every_round(rounds.append(fake.rounds)),
    )
    loop.run(burst=True)  # "more" claims again; an empty round with nothing running ends it
    assert fake.rounds == 3
    assert rounds == [0, 1, 2]  # pruning gets its chance before every round


def test_a_burst_claims_again_after_a_completion_written_during_its_empty_round() -> None:
    """A batched completion written while the last round claimed nothing (the job it releases
    was still waiting when the round looked) wakes the loop: the burst claims once more
    rather than end with that job left queued. The completer tells (wakes) before it stops
    counting the completion as pending, so the loop sees one or the other."""
    lane = Lane(["a"], 1, 0)
    wake = threading.Event()

    class Releasing(FakeLaneClaimer):
        def claim(self) -> bool:
            found = super().claim()
            if self.rounds == 1:
                wake.set()  # the completer wrote a batch during this round, and said so
            return found

    fake = Releasing(lane, [False, False])
    loop = ClaimLoop(
        [fake],  # type: ignore[list-item]
        LeaseTable(),
        poll_interval=timedelta(milliseconds=1),
        wake=wake,
        stopping=threading.Event(),
        between_rounds=lambda: 0.0,
        completing=lambda: False,  # by the idle check, nothing is pending any more
    )
    loop.run(burst=True)
    assert fake.rounds == 2


def test_a_failed_claim_is_retried_and_said_once(caplog: pytest.LogCaptureFixture) -> None:
    from sqlalchemy.exc import OperationalError

    stopping = threading.Event()
    lane = Lane(["a"], 1, 0)
    down = OperationalError("claim", {}, Exception("down"))
    fake = FakeLaneClaimer(lane, [down, down, False])
    loop = ClaimLoop(
        [fake],  # type: ignore[list-item]
        LeaseTable(),
        poll_interval=timedelta(milliseconds=1),
        wake=threading.Event(),
        stopping=stopping,
        between_rounds=lambda: every_round(stopping.set() if fake.rounds >= 3 else None),
    )
    with caplog.at_level(logging.INFO, logger="sa_jobqueue.worker"):
        loop.run(burst=False)
    messages = [r.getMessage() for r in caplog.records]
    assert len([m for m in messages if m.startswith("cannot claim")]) == 1  # once per outage
    assert "claiming again: the database is back" in messages


def test_the_loop_ends_when_stopped() -> None:
    stopping = threading.Event()
    lane = Lane(["a"], 1, 0)
    fake = FakeLaneClaimer(lane, [])
    loop = ClaimLoop(
        [fake],  # type: ignore[list-item]
        LeaseTable(),
        poll_interval=timedelta(milliseconds=1),
        wake=threading.Event(),
        stopping=stopping,
        between_rounds=lambda: every_round(stopping.set() if fake.rounds >= 2 else None),
    )
    loop.run(burst=False)
    assert fake.rounds == 3  # the round under way when it was stopped still ran


class FakeLimitsConnection:
    """Answers the read of which queues have a limit, counting the reads."""

    def __init__(self, limited: list[tuple[str, bool]]) -> None:
        self.limited = limited
        self.reads = 0

    def rows(self, statement: Any, params: dict[str, Any], *, again: bool = False) -> list[Any]:
        self.reads += 1
        return list(self.limited)


def test_the_limits_are_read_after_a_round_not_in_front_of_a_claim(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [100.0]
    monkeypatch.setattr(_claimer.time, "monotonic", lambda: now[0])
    conn = FakeLimitsConnection([("capped", False)])
    limits = _claimer.LimitedQueues(conn)  # type: ignore[arg-type]
    assert "capped" in limits  # the first question reads: nothing was read yet
    assert conn.reads == 1
    now[0] += 5 * _claimer.LIMITS_EVERY
    assert "plain" not in limits  # stale, but a claim's question does not wait for a read
    assert conn.reads == 1
    conn.limited = [("capped", False), ("plain", True)]
    assert limits.refresh()  # the read after the round: the limits changed
    assert conn.reads == 2
    assert "plain" in limits
    assert limits.keyed("plain")
    assert not limits.refresh()  # fresh: not read again
    now[0] += _claimer.LIMITS_EVERY
    assert not limits.refresh()  # read again, nothing changed
    assert conn.reads == 3
    limits.forget()  # a limited claim found the limits changed: read before the next claim
    assert "plain" in limits
    assert conn.reads == 4


def test_a_limit_changed_since_the_last_read_claims_again_at_once() -> None:
    stopping = threading.Event()
    lane = Lane(["a"], 1, 0)
    fake = FakeLaneClaimer(lane, [False, False])
    refreshed: list[int] = []

    class Limits:
        def refresh(self) -> bool:
            refreshed.append(fake.rounds)
            if fake.rounds >= 2:
                stopping.set()
            return fake.rounds == 1  # a limit changed after the first round

    waits: list[float] = []

    class Wake(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            waits.append(timeout or 0.0)
            return False

    loop = ClaimLoop(
        [fake],  # type: ignore[list-item]
        LeaseTable(),
        poll_interval=timedelta(seconds=60),
        wake=Wake(),
        stopping=stopping,
        between_rounds=lambda: 0.0,
        limits=Limits(),  # type: ignore[arg-type]
    )
    loop.run(burst=False)
    assert refreshed == [1, 2]
    assert len(waits) == 1  # the second round went out at once, not after the poll's wait


def steady_loop(
    fake: FakeLaneClaimer, stopping: threading.Event, between_rounds: Callable[[], float]
) -> ClaimLoop:
    """A claim loop (not a burst) of one scripted lane, polling every millisecond."""
    return ClaimLoop(
        [fake],  # type: ignore[list-item]
        LeaseTable(),
        poll_interval=timedelta(milliseconds=1),
        wake=threading.Event(),
        stopping=stopping,
        between_rounds=between_rounds,
    )


def test_the_loop_notes_each_turn_failed_claims_included() -> None:
    """The liveness probe's pulse: a turn whose claim failed (the database out) is a turn."""
    from sqlalchemy.exc import OperationalError

    stopping = threading.Event()
    lane = Lane(["a"], 1, 0)
    down = OperationalError("claim", {}, Exception("down"))
    fake = FakeLaneClaimer(lane, [down, False, down])
    turns: list[tuple[int, float | None]] = []

    def between_rounds() -> float:
        turns.append((fake.rounds, loop.last_turn))
        if fake.rounds >= 3:
            stopping.set()
        return 0.0

    loop = steady_loop(fake, stopping, between_rounds)
    assert loop.last_turn is None
    loop.run(burst=False)
    # Before every round, and before the one that stopped; each turn's time later than the last.
    assert [rounds for rounds, _ in turns] == [0, 1, 2, 3]
    times = [at for _, at in turns]
    assert all(at is not None for at in times)
    assert times == sorted(set(times))  # type: ignore[type-var]


def test_between_rounds_runs_only_once_due() -> None:
    """Pruning says when it is next due; the rounds before then do not call it."""
    stopping = threading.Event()
    calls: list[int] = []

    class Stopping(FakeLaneClaimer):
        def claim(self) -> bool:
            found = super().claim()
            if self.rounds >= 4:
                stopping.set()
            return found

    fake = Stopping(Lane(["a"], 1, 0), [])

    def between_rounds() -> float:
        calls.append(fake.rounds)
        return time.monotonic() + 3600

    loop = steady_loop(fake, stopping, between_rounds)
    loop.run(burst=False)
    assert fake.rounds == 4
    assert calls == [0]  # before the first round only: the next is an hour away
