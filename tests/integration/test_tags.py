"""Tags and meta: stored by every enqueue path, merged with the task's, checked before any SQL,
filtered by, and kept where the job's row is kept; each test rolled back.

A retry, which needs a worker and commits, is in tests/acceptance/test_tags.py.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from sa_jobqueue import JobContext, JobQueue, Task
from sa_jobqueue._validation import MAX_META_BYTES, MAX_TAGS
from sa_jobqueue.errors import InvalidJobError, TaskDefinitionError
from sa_jobqueue.models import jobs_table
from sa_jobqueue.ops import requeue_dead_jobs
from sa_jobqueue.ops.admin import list_jobs, requeue_job
from sa_jobqueue.periodic import enqueue_due
from sa_jobqueue.workflows import Call
from tests.helpers.job_states import add_dead
from tests.helpers.jobs import handler

j = jobs_table.c


def labels(conn: sa.Connection, job_id: int) -> tuple[Any, Any]:
    """The row's ``(tags, meta)`` as stored."""
    tags, meta = conn.execute(sa.select(j.tags, j.meta).where(j.id == job_id)).one()
    return tags, meta


@pytest.fixture
def queue() -> JobQueue:
    queue = JobQueue()
    queue.task(name="billed", queue="tags-q", tags=["billing"], meta={"team": "pay", "v": 1})(
        handler
    )
    queue.task(name="plain", queue="tags-q")(handler)
    queue.task(name="keyed", queue="tags-q", tags=["keyed"], unique_key=lambda p: p["k"])(handler)
    return queue


def test_the_tasks_tags_and_meta_merge_with_the_calls(
    conn: sa.Connection, session: Session, queue: JobQueue
) -> None:
    with session.begin():
        only_task = queue.enqueue(session, "billed", {})
        merged = queue.enqueue(
            session, "billed", {}, tags=["customer:42", "billing"], meta={"v": 2, "who": "ann"}
        )
        plain = queue.enqueue(session, "plain", {})
        own = queue.enqueue(session, "plain", {}, tags=["b", "a", "b"], meta={"x": [1, None]})
    assert labels(conn, only_task) == (["billing"], {"team": "pay", "v": 1})
    # The call's tags are added after the task's, repeats dropped; its meta's keys win.
    merged_meta = {"team": "pay", "v": 2, "who": "ann"}
    assert labels(conn, merged) == (["billing", "customer:42"], merged_meta)
    # Nothing given, nothing stored: NULL, not an empty array or object.
    assert labels(conn, plain) == (None, None)
    assert labels(conn, own) == (["b", "a"], {"x": [1, None]})
    # Empty values are none at all.
    with session.begin():
        empty = queue.enqueue(session, "plain", {}, tags=[], meta={})
    assert labels(conn, empty) == (None, None)


@pytest.mark.parametrize("n", [3, 250])  # an INSERT from arrays; COPY from 200 jobs on
def test_enqueue_many_gives_every_job_the_same_labels(
    conn: sa.Connection, session: Session, queue: JobQueue, n: int
) -> None:
    with session.begin():
        ids = queue.enqueue_many(
            session,
            "billed",
            [{"n": i} for i in range(n)],
            tags=["batch"],
            meta={"tab": "a\tb\\c", "quote": "it's"},  # COPY's text format escapes these
            run_at=timedelta(seconds=5),
        )
    meta = {"team": "pay", "v": 1, "tab": "a\tb\\c", "quote": "it's"}
    assert all(labels(conn, i) == (["billing", "batch"], meta) for i in ids)


def test_unique_enqueues_store_the_labels_and_a_held_key_keeps_its_own(
    conn: sa.Connection, session: Session, queue: JobQueue
) -> None:
    with session.begin():
        first = queue.enqueue(session, "keyed", {"k": "one"}, tags=["first"], meta={"n": 1})
        again = queue.enqueue(
            session, "keyed", {"k": "one"}, tags=["second"], unique_mode="replace"
        )
        many = queue.enqueue_many(session, "keyed", [{"k": "two"}, {"k": "one"}], tags=["many"])
    assert again == first
    assert again.updated
    # A replace gives the holder the call's payload, priority and due time, not its labels.
    assert labels(conn, first) == (["keyed", "first"], {"n": 1})
    assert many[1] == first
    assert labels(conn, many[0]) == (["keyed", "many"], None)


def test_workflows_and_periodic_ticks_store_them(
    conn: sa.Connection, session: Session, queue: JobQueue
) -> None:
    with session.begin():
        chained = queue.chain(
            session, [Call("billed", {}, {"tags": ["step"]}), Call("plain", {}, {"meta": {"s": 2}})]
        )
        *members, callback = queue.chord(
            session, [Call("plain", {}, {"tags": ["member"]})], Call("billed", {})
        )
    assert labels(conn, chained[0]) == (["billing", "step"], {"team": "pay", "v": 1})
    assert labels(conn, chained[1]) == (None, {"s": 2})
    assert labels(conn, members[0]) == (["member"], None)
    assert labels(conn, callback) == (["billing"], {"team": "pay", "v": 1})

    ticking = JobQueue()
    ticking.periodic("* * * * *", name="tags-tick")(
        ticking.task(name="tick", queue="tags-q", tags=["cron"], meta={"from": "schedule"})(handler)
    )
    enqueue_due(conn, ticking, now=sa_now(conn))
    enqueue_due(conn, ticking, now=sa_now(conn) + timedelta(minutes=2))
    (ticked,) = list_jobs(conn, task="tick")
    assert (ticked.tags, ticked.meta) == (["cron"], {"from": "schedule"})


def sa_now(conn: sa.Connection) -> Any:
    return conn.execute(sa.select(sa.func.now())).scalar_one()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tags": "billing"}, "tags must be a list of str"),
        ({"tags": ["ok", 3]}, "invalid tag 3"),
        ({"tags": ["has space"]}, "invalid tag 'has space'"),
        ({"tags": ["-leading"]}, "starting with a letter or digit"),
        ({"tags": ["x" * 65]}, "1-64 characters"),
        ({"tags": [f"t{i}" for i in range(MAX_TAGS)]}, f"at most {MAX_TAGS} tags, not 17"),
        ({"meta": ["a"]}, "meta must be a dict"),
        ({"meta": {1: "a"}}, "meta has a key 1 of type int"),
        ({"meta": {"f": float("nan")}}, 'meta\\["f"\\] is nan'),
        ({"meta": {"big": "x" * MAX_META_BYTES}}, f"over the limit of {MAX_META_BYTES}"),
    ],
)
def test_bad_tags_or_meta_are_refused_before_any_sql(
    conn: sa.Connection, session: Session, queue: JobQueue, options: dict[str, Any], message: str
) -> None:
    with session.begin():
        before = conn.execute(sa.select(sa.func.count()).select_from(jobs_table)).scalar_one()
        with pytest.raises(InvalidJobError, match=message):
            queue.enqueue(session, "billed", {}, **options)
        with pytest.raises(InvalidJobError, match=message):
            queue.enqueue_many(session, "billed", [{}], **options)
        # Nothing was sent: the transaction is usable and holds no new row.
        after = conn.execute(sa.select(sa.func.count()).select_from(jobs_table)).scalar_one()
    assert after == before


def test_a_task_with_bad_tags_or_meta_is_refused_at_its_declaration() -> None:
    with pytest.raises(TaskDefinitionError, match="invalid tag"):
        Task(name="t", handler=handler, tags=("no spaces allowed",))
    with pytest.raises(TaskDefinitionError, match="meta must be a dict"):
        Task(name="t", handler=handler, meta="x")  # type: ignore[arg-type]
    task = Task(name="t", handler=handler, tags=["a", "a", "b"])  # type: ignore[arg-type]
    assert task.tags == ("a", "b")


def test_list_jobs_filters_by_every_tag_given(
    conn: sa.Connection, session: Session, queue: JobQueue
) -> None:
    with session.begin():
        both = queue.enqueue(session, "plain", {}, tags=["red", "blue"])
        red = queue.enqueue(session, "plain", {}, tags=["red"])
        queue.enqueue(session, "plain", {})
    assert [job.id for job in list_jobs(conn, queue="tags-q", tags="red")] == [both, red]
    found = queue.list_jobs(session, queue="tags-q", tags=["blue", "red"])
    assert [(job.id, job.tags) for job in found] == [(both, ["red", "blue"])]
    assert list_jobs(conn, queue="tags-q", tags=["green"]) == []
    for bad in ([], ["no space"], "x" * 65):
        with pytest.raises(InvalidJobError):
            list_jobs(conn, tags=bad)


def test_requeued_dead_jobs_keep_their_labels(conn: sa.Connection) -> None:
    one = add_dead(conn, queue="tags-dead", tags=["a"], meta={"m": 1})
    many = [add_dead(conn, queue="tags-dead", tags=["b"], meta={"m": 2}) for _ in range(2)]
    assert requeue_job(conn, one)
    assert requeue_dead_jobs(conn, queue="tags-dead", batch=10).requeued == 2
    assert labels(conn, one) == (["a"], {"m": 1})
    assert {labels(conn, i) == (["b"], {"m": 2}) for i in many} == {True}


def test_the_handler_reads_them_when_it_asks(conn: sa.Connection, session: Session) -> None:
    queue = JobQueue()
    queue.task(name="asks", tags=["t"], meta={"k": "v"})(handler)
    with session.begin():
        job_id = queue.enqueue(session, "asks", {})
        bare = queue.enqueue(session, "asks", {}, tags=None)
        conn.execute(sa.update(jobs_table).where(j.id == bare).values(tags=None, meta=None))
    ctx = JobContext(
        job_id=job_id, task="asks", queue="default", attempt=1, max_attempts=5, session=session
    )
    assert ctx.tags_and_meta() == (["t"], {"k": "v"})
    ctx.job_id = bare
    assert ctx.tags_and_meta() == ([], {})
