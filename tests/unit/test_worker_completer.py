"""The completer: batches completions and tells what became of each, against a fake flush."""

from __future__ import annotations

import threading
import time

import pytest

from sa_jobqueue._deadlines import StopClock
from sa_jobqueue.worker._completer import BUSY_TRIES, Completer, Flushed

Pair = tuple[int, int]


class Recording:
    def __init__(self, matched: set[int] | None = None, fail: bool = False) -> None:
        self.batches: list[list[Pair]] = []
        self.completed: list[Pair] = []
        self.not_completed: list[Pair] = []
        self.unrecorded: list[Pair] = []
        self.matched = matched
        self.fail = fail
        self.gate = threading.Event()
        self.gate.set()

    def flush(self, batch: list[Pair], *, wait: bool = False) -> set[int]:
        assert self.gate.wait(10)
        self.batches.append(list(batch))
        if self.fail:
            raise OSError("connection lost")
        return {job_id for job_id, _ in batch if self.matched is None or job_id in self.matched}

    def completer(self, **kwargs: float) -> Completer:
        return Completer(
            self.flush,
            lambda job_id, attempt: self.not_completed.append((job_id, attempt)),
            self.completed.extend,
            self.unrecorded.extend,
            **kwargs,  # type: ignore[arg-type]
        )


def test_close_flushes_what_is_pending_and_each_pair_is_told_its_fate() -> None:
    seen = Recording(matched={1, 3})
    completer = seen.completer(max_delay=10.0)
    for pair in [(1, 1), (2, 1), (3, 2)]:
        completer.add(*pair)
    completer.close()
    assert seen.batches == [[(1, 1), (2, 1), (3, 2)]]  # one statement for all three
    assert seen.completed == [(1, 1), (3, 2)]
    assert seen.not_completed == [(2, 1)]
    assert seen.unrecorded == []


def test_batches_hold_at_most_batch_size_pairs() -> None:
    seen = Recording()
    seen.gate.clear()  # hold the first flush until everything is queued
    completer = seen.completer(batch_size=2, max_delay=10.0)
    for job_id in range(5):
        completer.add(job_id, 1)
    seen.gate.set()
    completer.close()
    assert [len(b) for b in seen.batches] == [2, 2, 1]
    assert [pair for b in seen.batches for pair in b] == [(i, 1) for i in range(5)]


def test_a_failed_flush_reports_its_pairs_unrecorded_and_the_thread_goes_on() -> None:
    seen = Recording(fail=True)
    completer = seen.completer(max_delay=10.0)
    completer.add(1, 1)
    completer.add(2, 1)
    completer.close()
    assert seen.unrecorded == [(1, 1), (2, 1)]
    assert (seen.completed, seen.not_completed) == ([], [])


def test_a_callback_that_raises_does_not_stop_the_others() -> None:
    not_completed: list[Pair] = []

    def complain(pairs: list[Pair]) -> None:
        raise RuntimeError("an observer's trouble")

    completer = Completer(
        lambda batch, wait: {1}, lambda j, a: not_completed.append((j, a)), complain, max_delay=10.0
    )
    completer.add(1, 1)
    completer.add(2, 1)
    completer.close()
    assert not_completed == [(2, 1)]


class FailingFor(Recording):
    """A flush whose first ``failures`` tries fail, each once the test lets it go on."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.tries = [(threading.Event(), threading.Event()) for _ in range(failures)]

    def flush(self, batch: list[Pair], *, wait: bool = False) -> set[int]:
        if self.tries:
            started, go_on = self.tries.pop(0)
            started.set()
            assert go_on.wait(10)
            raise OSError("too many clients")
        return super().flush(batch)


def test_a_failed_batch_is_retried_and_add_waits_meanwhile() -> None:
    seen = FailingFor(failures=2)
    (first, fail_first), (second, fail_second) = seen.tries
    completer = Completer(
        seen.flush,
        lambda job_id, attempt: seen.not_completed.append((job_id, attempt)),
        seen.completed.extend,
        seen.unrecorded.extend,
        max_delay=0.0,
        retry_for=10.0,
    )
    completer.add(1, 1)
    assert first.wait(10)
    fail_first.set()
    assert second.wait(10)  # the batch is being retried
    # Meanwhile the next completion waits (its job's thread keeps its slot, so the worker
    # claims no more jobs), and goes out once the retry has written the first.
    adding = threading.Thread(target=completer.add, args=(2, 1))
    adding.start()
    adding.join(0.2)
    assert adding.is_alive()
    fail_second.set()
    adding.join(10)
    assert not adding.is_alive()
    completer.close()
    assert seen.unrecorded == []
    assert seen.completed == [(1, 1), (2, 1)]
    assert seen.batches[0] == [(1, 1)]


def test_a_batch_that_keeps_failing_is_given_up_after_retry_for() -> None:
    seen = Recording(fail=True)
    completer = Completer(
        seen.flush, lambda j, a: None, None, seen.unrecorded.extend, retry_for=0.2
    )
    completer.add(1, 1)
    completer.close()
    assert seen.unrecorded == [(1, 1)]
    assert len(seen.batches) > 1  # tried more than once before giving up


def test_close_gives_up_waiting_after_its_timeout_and_counts_what_is_unwritten() -> None:
    recording = Recording()
    recording.gate.clear()  # the flush hangs, as on a silent connection
    completer = recording.completer(max_delay=0.0)
    completer.add(1, 1)
    completer.add(2, 1)
    assert completer.close(timeout=0.2) == 2
    recording.gate.set()


def test_a_stopping_worker_retries_no_longer_than_its_clock_allows() -> None:
    clock = StopClock()
    recording = Recording(fail=True)
    completer = Completer(
        recording.flush,
        lambda job_id, attempt: None,
        on_unrecorded=recording.unrecorded.extend,
        retry_for=60.0,
        clock=clock,
    )
    clock.stop(0.3)
    completer.add(1, 1)
    assert completer.close(timeout=5) == 0  # given up within the clock's 0.3 s, not 60 s
    assert recording.unrecorded == [(1, 1)]


def test_try_add_queues_at_once_and_refuses_while_a_failed_batch_is_retried() -> None:
    seen = FailingFor(failures=2)
    (first, fail_first), (second, fail_second) = seen.tries
    completer = Completer(
        seen.flush,
        lambda job_id, attempt: seen.not_completed.append((job_id, attempt)),
        seen.completed.extend,
        seen.unrecorded.extend,
        max_delay=0.0,
        retry_for=10.0,
    )
    assert completer.try_add(1, 1)
    assert first.wait(10)
    fail_first.set()
    assert second.wait(10)  # the batch is being retried
    # Where add would wait, try_add refuses, and queues nothing.
    assert not completer.try_add(2, 1)
    fail_second.set()
    completer.close()
    assert seen.completed == [(1, 1)]
    assert seen.not_completed == seen.unrecorded == []


def test_try_add_refuses_once_max_pending_completions_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("sa_jobqueue.worker._completer.MAX_PENDING", 2)
    flushing = threading.Event()
    go_on = threading.Event()
    flushed: list[list[Pair]] = []

    def flush(batch: list[Pair], *, wait: bool = False) -> set[int]:
        flushing.set()
        assert go_on.wait(10)
        flushed.append(list(batch))
        return {job_id for job_id, _ in batch}

    completer = Completer(flush, lambda job_id, attempt: None, max_delay=0.0)
    assert completer.try_add(1, 1)
    assert flushing.wait(10)  # the first batch is out, its statement hanging
    assert completer.try_add(2, 1)
    assert completer.try_add(3, 1)
    assert not completer.try_add(4, 1)  # two wait already
    go_on.set()
    completer.close()
    assert sorted(pair for batch in flushed for pair in batch) == [(1, 1), (2, 1), (3, 1)]


def test_a_completion_whose_row_is_locked_is_tried_again_not_settled_nor_waited_for() -> None:
    """A row another transaction holds locked comes back busy: neither completed nor stale,
    it is tried again in a later batch; a completion found busy BUSY_TRIES times then waits."""
    tries: list[tuple[list[Pair], bool]] = []
    completed: list[Pair] = []
    not_completed: list[Pair] = []
    locked_for = {2: 3, 3: BUSY_TRIES + 5}  # job 3's lock outlasts the tries

    def flush(batch: list[Pair], *, wait: bool) -> Flushed:
        tries.append((list(batch), wait))
        busy = [p for p in batch if not wait and locked_for.get(p[0], 0) > 0]
        for job_id, _ in busy:
            locked_for[job_id] -= 1
        return Flushed({j for j, _ in batch if (j, 1) not in busy}, busy)

    completer = Completer(flush, lambda *pair: not_completed.append(pair), completed.extend)
    for job_id in (1, 2, 3):
        completer.add(job_id, 1)
    # The busy pairs are tried again on their own, with no new completion to carry them.
    deadline = time.monotonic() + 10
    while len(completed) < 3:
        assert time.monotonic() < deadline, tries
        time.sleep(0.005)
    assert completer.close() == 0
    assert sorted(completed) == [(1, 1), (2, 1), (3, 1)]
    assert not_completed == []
    waits = [wait for batch, wait in tries if (3, 1) in batch]
    assert waits == [False] * BUSY_TRIES + [True]  # then it waited for the lock
    assert sum((2, 1) in batch for batch, _ in tries) == 4
