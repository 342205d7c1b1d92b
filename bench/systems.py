"""Every system the benchmark knows, by key."""

from __future__ import annotations

from bench.adapters.base import System
from bench.adapters.chancy_adapter import Chancy, ChancyTuned
from bench.adapters.pgqueuer_adapter import PgQueuer, PgQueuerB500, PgQueuerPsycopg, PgQueuerTuned
from bench.adapters.procrastinate_adapter import Procrastinate, ProcrastinateTuned
from bench.adapters.reference import Reference
from bench.adapters.sa_jobqueue_adapter import SaJobqueue, SaJobqueueConcurrency, SaJobqueueTagged

SYSTEMS: dict[str, System] = {
    s.key: s
    for s in (
        SaJobqueue(),
        SaJobqueueConcurrency(2),
        SaJobqueueTagged(),
        SaJobqueueTagged(gin=True),
        Procrastinate(),
        ProcrastinateTuned(),
        PgQueuer(),
        PgQueuerTuned(),
        PgQueuerB500(),
        PgQueuerPsycopg(),
        Chancy(),
        ChancyTuned(),
        Reference(),
    )
}
