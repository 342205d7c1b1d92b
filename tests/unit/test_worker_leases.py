"""The lease table: which attempts are still held, slots, wake-ups, renewal scheduling."""

from __future__ import annotations

import threading
from datetime import timedelta

from sa_jobqueue.tasks import Backoff, JobContext, Task
from sa_jobqueue.worker._claimed import Claimed
from sa_jobqueue.worker._lanes import Lane
from sa_jobqueue.worker._leases import (
    HEARTBEAT_RETRY,
    LeaseTable,
    Stage,
    overdue,
    renewal_due,
    schedule_renewals,
    schedule_retries,
)


def claimed(job_id: int, attempt: int = 1, lease: float = 30.0) -> Claimed:
    return Claimed(
        job_id, "default", "t", "null", "running", attempt, 5, timedelta(seconds=lease), None, None
    )


def context(job: Claimed) -> JobContext:
    return JobContext(
        job_id=job.id,
        task=job.task,
        queue=job.queue,
        attempt=job.attempts,
        max_attempts=job.max_attempts,
        session=lambda: None,  # type: ignore[arg-type,return-value]
    )


def task(timeout: timedelta | None = None) -> Task:
    return Task(name="t", handler=lambda ctx, payload: None, timeout=timeout)


def test_held_from_claim_to_finish_and_counted_in_its_lane() -> None:
    table, lane = LeaseTable(), Lane(["default"], 2, 0)
    job = claimed(7)
    ticket = table.hold(lane, job)
    assert lane.held == 1
    assert list(table.tickets) == [ticket]
    held = table.snapshot()
    assert list(held) == [7]
    assert held[7].attempt == 1
    assert table.ours(held) == {7}
    assert table.take(ticket)
    table.let_go(ticket)
    assert lane.held == 0
    assert table.tickets == {}
    assert table.snapshot() == {}
    assert table.ours(held) == set()  # finished meanwhile: not renewed


def test_a_stale_attempt_cannot_touch_the_next_attempts_entry() -> None:
    table, lane = LeaseTable(), Lane(["default"], 2, 0)
    first = table.hold(lane, claimed(7, attempt=1))
    # The first attempt timed out, ran on, and the worker claimed the job again.
    second = table.hold(lane, claimed(7, attempt=2))
    t = task(timeout=timedelta(seconds=1))
    ctx = context(claimed(7, attempt=1))
    table.start(claimed(7, attempt=1), ctx, t, None, Backoff())
    assert table.snapshot()[7].ctx is None  # the old attempt armed nothing
    table.await_group(claimed(7, attempt=1))
    assert not table.snapshot()[7].grouped
    table.forget([claimed(7, attempt=1)])
    table.let_go(first)
    assert table.snapshot()[7].attempt == 2  # still held, still renewed
    table.let_go(second)
    assert table.snapshot() == {}


def test_a_job_whose_lease_ran_out_in_the_buffer_is_not_started_and_frees_its_slot() -> None:
    """The worker stalled (or its renewals failed) for longer than the lease while the job
    waited for a thread: another worker may run it already, so no thread starts it here."""
    table, lane = LeaseTable(), Lane(["default"], 2, 0)
    ticket = table.hold(lane, claimed(7, lease=0))  # a lease that has run out at once
    assert not table.take(ticket)
    assert ticket.stage is Stage.LOST
    assert (lane.held, table.tickets, table.snapshot()) == (0, {}, {})


def test_a_job_a_renewal_found_lost_or_claimed_again_is_not_started() -> None:
    table, lane = LeaseTable(), Lane(["default"], 3, 0)
    lost = table.hold(lane, claimed(1))
    table.snapshot()[1].lost = True  # as the heartbeat marks an attempt it could not renew
    assert not table.take(lost)
    assert lost.stage is Stage.LOST
    # Its lease ran out and this worker's next claim took the job's next attempt.
    stale = table.hold(lane, claimed(2, attempt=1))
    fresh = table.hold(lane, claimed(2, attempt=2))
    assert not table.take(stale)
    assert table.take(fresh)
    assert table.snapshot()[2].attempt == 2


def test_starting_arms_the_timeout_and_a_grouped_job_keeps_its_lease_until_forgotten() -> None:
    table, lane = LeaseTable(), Lane(["default"], 2, 0)
    job = claimed(3)
    ticket = table.hold(lane, job)
    ctx = context(job)
    table.start(job, ctx, task(timeout=timedelta(seconds=5)), None, Backoff())
    held = table.snapshot()[3]
    assert held.ctx is ctx
    assert held.deadline is not None
    assert overdue(table.snapshot(), held.deadline + 0.1) == [3]
    table.await_group(job)
    assert held.grouped
    assert held.ctx is None
    assert held.deadline is None
    table.let_go(ticket)
    assert list(table.snapshot()) == [3]  # renewed until its group commits
    table.forget([job])
    assert table.snapshot() == {}


def test_a_timed_out_attempt_is_dropped_only_if_still_the_same_entry() -> None:
    table, lane = LeaseTable(), Lane(["default"], 2, 0)
    table.hold(lane, claimed(5))
    old = table.snapshot()[5]
    table.hold(lane, claimed(5, attempt=2))
    table.drop(5, old)
    assert table.snapshot()[5].attempt == 2
    table.drop(5, table.snapshot()[5])
    assert table.snapshot() == {}


def test_a_freed_slot_wakes_the_claim_loop_once_a_saturated_lane_runs_low() -> None:
    table = LeaseTable()
    lane = Lane(["default"], 2, 2)  # capacity 4, low water 3
    tickets = [table.hold(lane, claimed(i)) for i in range(4)]
    assert table.busy([lane]) == (4, False)
    table.round_ended(lane, True, False)
    assert table.let_go(tickets[0])  # held 3: at low water
    assert not lane.saturated  # woken once
    assert table.busy([lane]) == (3, False)
    assert not table.let_go(tickets[1])  # nothing left behind: no wake
    table.round_ended(lane, False, True)  # a queue at its cap: a freed slot wakes too
    assert table.busy([lane]) == (2, True)


def test_a_burst_wakes_at_every_finish_and_open_groups_count_as_running() -> None:
    table, lane = LeaseTable(burst=True), Lane(["default"], 2, 0)
    ticket = table.hold(lane, claimed(1))
    table.group_opened()
    assert table.let_go(ticket)
    assert table.busy([lane]) == (1, False)
    table.group_closed()
    assert table.busy([lane]) == (0, False)


def test_shutdown_hands_back_the_jobs_no_thread_took_and_waits_for_the_others() -> None:
    table, lane = LeaseTable(), Lane(["default"], 2, 0)
    running, waiting = table.hold(lane, claimed(1)), table.hold(lane, claimed(2))
    assert table.take(running)
    assert [job.id for job in table.hand_back_waiting()] == [2]
    assert not table.take(waiting)  # a thread that gets to it now skips it
    assert lane.held == 1
    assert [job.id for job in table.wait_all_done(0.01)] == [1]  # still running
    finisher = threading.Timer(0.05, table.let_go, args=(running,))
    finisher.start()
    assert table.wait_all_done(10) == []
    finisher.join()


def test_renewals_are_spaced_a_third_of_the_lease_and_retried_sooner() -> None:
    table, lane = LeaseTable(), Lane(["default"], 2, 0)
    table.hold(lane, claimed(1, lease=30))
    table.hold(lane, claimed(2, lease=3))
    held = table.snapshot()
    assert not renewal_due(held, 0.0)
    assert renewal_due(held, held[2].renew_at)
    expires = held[2].expires
    schedule_renewals(held, 100.0, busy={2})
    assert held[1].renew_at == 110.0
    assert held[1].expires == 130.0  # renewed at 100: its lease runs to 100 + 30
    assert held[2].renew_at == 100.0 + HEARTBEAT_RETRY
    assert held[2].expires == expires  # not renewed: its lease runs out as before
    schedule_retries(held, 200.0)
    assert held[1].renew_at == 203.0  # a tenth of the lease
    assert held[2].renew_at == 200.5  # at least half a second
