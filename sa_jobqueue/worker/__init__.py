"""The worker: a claim loop feeding job threads and an event loop, a heartbeat, a listener.

One worker process serves its queues in lanes (all queues sharing ``concurrency`` threads, or
one lane per queue with a concurrency each)::

    claim loop ──claims into free slots──► job threads (sync) ──► fenced completion
        ▲   ▲                        └──► event loop (async)       (batched, grouped, or
        │   └── slot freed when the buffer is half empty ◄─────────  with the handler's tx)
        └────── NOTIFY from enqueue, or the jittered poll as the safety net

:class:`Worker` only builds and wires the parts (``_wiring``, once per run), each a class of
its own that takes what it needs in its constructor (none inherits another, and nothing is
wired in after construction).
The one cycle, the runner recording through the recorder whose hand-off claims jobs for the
runner, goes through a port (``_lanes.Intake``) the runner attaches to as it is built. Their
modules are internal, not a stable API:

- ``_lanes``: a ``Lane`` (queues sharing job threads and a claim buffer), the one owner of its
  counts, buffer and adaptive size, changed only through its methods named for events
  (claimed, finished, a claim round starting or ending);
- ``_claimer``: a ``LaneClaimer`` per lane, and the claim loop that paces them;
- ``_attempt``: the one pipeline of an attempt (start, payload, middleware and handler, flush,
  result, run time) that every path below runs through;
- ``_runner``: runs a claimed attempt on a job thread, the event loop (``_event_loop``) or in a
  child process (``_isolation``), in the handler's session (``_sessions``) or its thread's
  group transaction (``_groups``, which also settles a grouped job: its savepoint joins the
  group or rolls back);
- ``_batches``: a batch task's batch, formed around a claimed job on its thread (the claim
  that fills it, its leases), run once and settled together in one transaction;
- ``_settlement``: the one pure function from how a handler ended to a verdict, and the
  outcome names observers see;
- ``_recorder``: the one door an outcome leaves by: each verdict written, fenced, and told to
  the observers (``_reports``), whichever path ran the attempt (a group's or a batch's
  commit, a child's end, the heartbeat's timeout included); successes through
  ``_successes`` (with the handler's writes, a group's commit, or batched by
  ``_completer``, where the ``HandOff`` claims a freed slot's next job in the completion's
  own statement); ``_retries`` tries statements again through transient errors;
- ``_leases``: the lease table, the one place that knows which attempts are still held (and
  the lock under which lanes count their jobs);
- ``_heartbeat``: renews leases, stops lost, cancelled and timed-out handlers;
- ``_upkeep``: the worker registry, periodic schedules and pruning; ``_listener``: LISTEN;
- ``_pulse``: reads when the claim loop and the heartbeat last went round (each notes its
  own ``last_turn``) for ``Worker.stalled`` and the liveness probe; ``_embedding``: the
  engines ``Worker.from_url`` builds, and ``arun``.

Several worker processes: :class:`Supervisor` (``_supervisor``) starts, restarts and stops
them; ``_child`` is what runs in each (its signals, the recycler, its exit status).

What it does not promise: that a handler runs once. A job whose worker dies, freezes past its
lease or loses its connection while completing runs again elsewhere. Writes through
``ctx.session`` commit together with the completion, so they happen exactly once.
"""

from __future__ import annotations

from ._claimer import OUTAGE_RETRY_CAP
from ._lanes import undeclared_queues
from ._supervisor import Supervisor
from ._upkeep import (
    PERIODIC_INTERVAL,
    PRESENCE_INTERVAL,
    PRUNE_BATCH,
    PRUNE_INTERVAL,
    PRUNE_MAX_BATCHES,
    WORKER_STALE,
)
from ._worker import STOP_MARGIN, Worker

__all__ = [
    "OUTAGE_RETRY_CAP",
    "PERIODIC_INTERVAL",
    "PRESENCE_INTERVAL",
    "PRUNE_BATCH",
    "PRUNE_INTERVAL",
    "PRUNE_MAX_BATCHES",
    "STOP_MARGIN",
    "WORKER_STALE",
    "Supervisor",
    "Worker",
    "undeclared_queues",
]
