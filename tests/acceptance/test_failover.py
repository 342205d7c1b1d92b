"""A failover under running workers: the primary stopped hard, its streaming replica promoted.

Two PostgreSQL 15 clusters of the test's own (:mod:`tests.helpers.replication`): a primary and
a replica made with ``pg_basebackup -R``. Everything reaches them through one multi-host URL
(``?host=...&host=...&target_session_attrs=read-write``), as an application would: the
migration, the enqueue and two real ``sa-jobqueue worker`` subprocesses, which drain writing
jobs (one row each through ``ctx.session``, in a table without a unique key, so a second effect
would show). A third of the way through, the primary is stopped with ``pg_ctl stop -m
immediate`` and the replica promoted. Every job must then succeed on the new primary, each
effect written once.

With an asynchronous replica, completions the old primary had committed but not yet sent are
rolled back by the promotion: their jobs run again (that is the cost of asynchronous
replication, measured here, not asserted). With a synchronous one (``synchronous_commit=on``
and the replica in ``synchronous_standby_names``) no completion committed before the stop is
lost: each job that had succeeded keeps its success, as it was.
"""

from __future__ import annotations

import collections
import time
from datetime import datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from sa_jobqueue.database import create_engine
from sa_jobqueue.models import jobs_table
from tests.apps import network
from tests.helpers.jobs import statuses
from tests.helpers.processes import WorkerApp, Workers, run_cli
from tests.helpers.replication import MISSING, ReplicatedPair, replicated_pair

WORKER_APP = WorkerApp("tests.apps.network:queue", log_level="INFO")
j = jobs_table.c
#: Enough jobs that the failover lands mid-drain, few enough for a variant of about 30 s.
JOBS = 1_500

pytestmark = [pytest.mark.slow, pytest.mark.skipif(MISSING is not None, reason=MISSING or "")]


def successes(engine: sa.Engine) -> dict[int, datetime]:
    """The succeeded jobs and when each finished."""
    with engine.connect() as conn:
        rows = conn.execute(sa.select(j.id, j.finished_at).where(j.status == "succeeded"))
        return {job_id: finished for job_id, finished in rows}


def effects_per_job(engine: sa.Engine) -> collections.Counter[int]:
    with engine.connect() as conn:
        return collections.Counter(conn.execute(sa.select(network.effects.c.job_id)).scalars())


def fail_over_mid_drain(
    pair: ReplicatedPair, tmp_path: Path, *, lagging: bool
) -> tuple[dict[int, datetime], dict[int, datetime]]:
    """Drain :data:`JOBS` writing jobs through the multi-host URL, failing over a third of the
    way; the successes seen just before the stop, and all of them at the end.

    ``lagging``: the replica receives nothing from a third of the way on, and the failover
    comes 100 successes later or more: those are committed on the old primary only.
    """
    url = pair.url()
    migrated = run_cli("migrate", "--database-url", url.render_as_string(hide_password=False))
    assert migrated.returncode == 0, migrated.stderr
    engine = create_engine(url)
    workers = Workers(WORKER_APP, url, tmp_path)
    try:
        network.metadata.create_all(engine)
        with Session(engine) as session, session.begin():
            enqueued = network.queue.enqueue_many(
                session, "write_briefly", [{"n": i} for i in range(JOBS)]
            )
            ids = [int(i) for i in enqueued]
        started = [workers.start(concurrency=4) for _ in range(2)]
        # Both running before the primary goes: a worker that starts while no server takes
        # writes refuses to start ("cannot connect"), as it should; a supervisor restarts it.
        workers.wait_registered(started, timeout=30)
        workers.wait(lambda: statuses(engine, ids)["succeeded"] >= JOBS // 3, timeout=60)
        if lagging:
            pair.lag()
            lagged = statuses(engine, ids)["succeeded"]
            workers.wait(lambda: statuses(engine, ids)["succeeded"] >= lagged + 100, timeout=60)
        before = successes(engine)
        pair.fail_over()
        promoted = time.monotonic()
        engine.dispose()  # its pooled connections went with the old primary
        with engine.connect() as conn:
            promoted_at = conn.execute(sa.select(sa.func.now())).scalar_one()
        at_promotion = len(successes(engine))
        found = workers.wait(
            lambda: len(successes(engine)) > at_promotion and time.monotonic(), timeout=30
        )
        # The bound: the rest of the drain, plus the lease (4 s) of a job whose success the
        # promotion rolled back while its claim survived.
        try:
            workers.wait(lambda: statuses(engine, ids) == {"succeeded": JOBS}, timeout=60)
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}: {statuses(engine, ids)}\n{workers.all_output()}\n{pair.logs()}"
            ) from None
        after = successes(engine)
        effects = effects_per_job(engine)
        assert sorted(effects) == sorted(ids)
        assert set(effects.values()) == {1}, "a job's effect was written twice"
        rerun = [i for i, finished in before.items() if after[i] != finished]
        last = max(((after[i] - promoted_at).total_seconds() for i in rerun), default=0.0)
        print(  # what a failover cost, for people (-s): measured, not asserted
            f"\nfailover: {len(before)} succeeded before the stop, {len(rerun)} of them rolled"
            f" back by the promotion and run again, the last {last:.1f} s after it; the first"
            f" success on the new primary {found - promoted:.2f} s after the promotion, the"
            f" last {time.monotonic() - promoted:.1f} s after it"
        )
        workers.terminate_all()
        return before, after
    finally:
        workers.kill_all()
        engine.dispose()


@pytest.mark.timeout(180)
def test_a_failover_to_an_asynchronous_replica_loses_no_job_and_no_effect_runs_twice(
    tmp_path: Path,
) -> None:
    with replicated_pair(synchronous=False) as pair:
        before, after = fail_over_mid_drain(pair, tmp_path, lagging=True)
    # The successes the replica never received were rolled back, and ran again.
    assert any(after[i] != finished for i, finished in before.items())


@pytest.mark.timeout(180)
def test_a_failover_to_a_synchronous_replica_keeps_every_committed_success(
    tmp_path: Path,
) -> None:
    with replicated_pair(synchronous=True) as pair:
        before, after = fail_over_mid_drain(pair, tmp_path, lagging=False)
    assert {i: after[i] for i in before} == before, "a committed success was rolled back"
