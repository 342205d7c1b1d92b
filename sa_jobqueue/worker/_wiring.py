"""One run of a :class:`Worker`, wired: its collaborators, each built with what it needs, and
the threads that will run them.

:meth:`Worker.run` calls :func:`wire` once per run, after the schema check, then starts the
threads, runs the claim loop and, as it stops, winds the parts down in order (see
:class:`Wired`). Nothing here starts a thread or opens a connection.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._attempt import Pipeline
from ._batches import Batches
from ._claimer import ClaimLoop, LaneClaimer, LimitedQueues
from ._event_loop import EventLoopThread
from ._groups import Groups
from ._heartbeat import Heartbeat
from ._lanes import Intake
from ._listener import listen
from ._pulse import CLAIM_LOOP, HEARTBEAT
from ._recorder import Recorder
from ._reports import Reports
from ._runner import Runner
from ._successes import HandOff
from ._upkeep import Upkeep

if TYPE_CHECKING:
    from ._worker import Worker


@dataclass(frozen=True)
class Wired:
    """The parts of one run that :meth:`Worker.run` starts and, as it stops, winds down."""

    #: The one door outcomes leave by; closed once the job threads are done.
    recorder: Recorder
    #: The event loop of async handlers (None without any), closed after the job threads.
    loop: EventLoopThread | None
    #: The claim loop, run on the calling thread until the worker stops (or a burst ends).
    claims: ClaimLoop
    #: A thread per slot of each lane, not started yet.
    job_threads: list[threading.Thread]
    #: The heartbeat, the upkeep and (with ``listen``) the listener, not started yet.
    helpers: list[threading.Thread]


def wire(worker: Worker, burst: bool) -> Wired:
    """Build ``worker``'s collaborators for one run (``burst`` or not), and their threads."""
    # Each collaborator gets what it needs in its constructor. The one cycle (the runner
    # records through the recorder, whose hand-off claims jobs for the runner) goes
    # through ``intake``, which the runner attaches to as it is built (see Intake).
    intake = Intake()
    limits = LimitedQueues(worker._claimer)
    # In a burst, a written completion may make more work due (a job that waited for it):
    # the claim loop looks again once the completions are written, rather than stop.
    recorder = Recorder(
        worker._single,
        Reports(worker._observe),
        handoff=HandOff(worker.name, limits, worker._lane_of, intake, worker._stopping),
        on_flushed=worker._wake.set if burst else None,
        clock=worker._clock,
    )
    loop = None
    if worker._has_async:
        loop = EventLoopThread(
            worker.engine.url, pool_size=worker.concurrency, pooler=worker.pooler
        )
    pipeline = Pipeline(worker.queue, worker._leases, recorder)
    batches = Batches(
        worker.queue,
        worker.engine,
        worker._single,
        worker._leases,
        recorder,
        pipeline,
        worker=worker.name,
        loop=loop,
        stopping=worker._stopping,
        wake=worker._wake,
    )
    runner = Runner(
        worker.queue,
        worker.engine,
        worker._leases,
        recorder,
        pipeline,
        Groups(worker.engine, worker._leases, recorder, worker._wake),
        loop=loop,
        stopping=worker._stopping,
        wake=worker._wake,
        intake=intake,
        batches=batches if batches.tasks else None,
    )
    claims = ClaimLoop(
        [
            LaneClaimer(lane, worker._claimer, worker.name, worker._leases, runner.submit, limits)
            for lane in worker._lanes
        ],
        worker._leases,
        poll_interval=worker.poll_interval,
        wake=worker._wake,
        stopping=worker._stopping,
        between_rounds=worker._pruner.round,
        completing=recorder.completing,
        limits=limits,
    )
    heartbeat = Heartbeat(
        worker._single,
        worker._leases,
        recorder,
        worker._observe,
        worker._halt,
    )
    worker._pulse.watch({CLAIM_LOOP: claims, HEARTBEAT: heartbeat})
    upkeep = Upkeep(
        worker.queue,
        worker._single,
        name=worker.name,
        queues=worker.queues,
        concurrency=worker.concurrency,
        wake=worker._wake,
        stopping=worker._stopping,
        halt=worker._halt,
    )
    job_threads = [
        threading.Thread(
            target=runner.thread,
            args=(lane,),
            name=f"sa_jobqueue-job-{lane.queues[0]}-{i}",
            daemon=True,
        )
        for lane in worker._lanes
        for i in range(lane.concurrency)
    ]
    helpers = [
        threading.Thread(target=heartbeat.loop, name="sa_jobqueue-heartbeat", daemon=True),
        threading.Thread(target=upkeep.loop, name="sa_jobqueue-upkeep", daemon=True),
    ]
    if worker.listen:
        helpers.append(
            threading.Thread(
                target=listen,
                args=(worker.engine, worker.served, worker._wake, worker._stopping, worker._clock),
                name="sa_jobqueue-listener",
                daemon=True,
            )
        )
    return Wired(recorder, loop, claims, job_threads, helpers)
