"""Typed payloads end to end: enqueue in a committed transaction, a real worker (drain) rebuilds
the handler's typed value; refusals at enqueue, and stored payloads that no longer fit."""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any, NotRequired

import pydantic
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session
from typing_extensions import TypedDict

from sa_jobqueue import JobContext, JobQueue
from sa_jobqueue.errors import PayloadTypeError
from sa_jobqueue.models import jobs_table
from sa_jobqueue.tasks import Backoff
from sa_jobqueue.testing import drain
from sa_jobqueue.workflows import Call

HOURLY = Backoff(base=timedelta(hours=1), cap=timedelta(hours=1), jitter=0)


@dataclass(frozen=True)
class Line:
    sku: str
    quantity: int = 1


@dataclass(frozen=True)
class Order:
    order_id: int
    placed_at: datetime
    lines: list[Line]
    coupon: str | None = None


class Mail(TypedDict):
    to: str
    cc: NotRequired[list[str]]


class Invoice(pydantic.BaseModel):
    number: int
    reference: uuid.UUID


class Carrier(enum.Enum):
    POST = "post"
    COURIER = "courier"


@dataclass(frozen=True)
class Parcel:
    ref: uuid.UUID
    value: Decimal
    carrier: Carrier
    due: date
    lines: list[Line]
    weights: dict[str, float]
    at: datetime | None = None
    note: str | None = None
    tags: list[str] = field(default_factory=list)


PLACED = datetime(2026, 11, 27, 9, 30, tzinfo=UTC)
ORDER = Order(7, PLACED, [Line("apple", 3), Line("pear")])


def typed_queue(seen: list[Any]) -> JobQueue:
    """A queue of typed tasks whose handlers record what they were given."""
    queue = JobQueue()

    @queue.task
    def ship(ctx: JobContext, payload: Order) -> None:
        assert isinstance(payload, Order)
        seen.append(payload)

    @queue.task
    def mail(ctx: JobContext, payload: Mail) -> None:
        seen.append(payload)

    @queue.task
    def bill(ctx: JobContext, payload: Invoice) -> None:
        assert isinstance(payload, Invoice)
        seen.append(payload)

    @queue.task
    async def ship_async(ctx: JobContext, payload: Order) -> None:
        assert isinstance(payload, Order)
        seen.append(payload)

    return queue


def stored(engine: sa.Engine) -> list[Any]:
    with engine.connect() as conn:
        query = sa.select(jobs_table.c.payload).order_by(jobs_table.c.id)
        return list(conn.scalars(query))


def test_each_kind_is_stored_as_json_and_rebuilt_before_the_handler_runs(
    tables: sa.Engine,
) -> None:
    seen: list[Any] = []
    queue = typed_queue(seen)
    invoice = Invoice(number=12, reference=uuid.UUID(int=5))
    with Session(tables) as session, session.begin():
        queue.enqueue(session, "ship", ORDER)
        queue.enqueue(session, "mail", Mail(to="a@example.com", cc=["b@example.com"]))
        queue.enqueue(session, "bill", invoice)
        queue.enqueue(session, "ship_async", ORDER)

    assert stored(tables) == [
        {
            "order_id": 7,
            "placed_at": "2026-11-27T09:30:00Z",
            "lines": [{"sku": "apple", "quantity": 3}, {"sku": "pear", "quantity": 1}],
            "coupon": None,
        },
        {"to": "a@example.com", "cc": ["b@example.com"]},
        {"number": 12, "reference": "00000000-0000-0000-0000-000000000005"},
        stored(tables)[0],
    ]
    result = drain(queue, tables)

    assert (result.succeeded, result.failed) == (4, 0)
    # The async handler runs on the worker's event loop, beside the others: in any order.
    expected = [ORDER, {"to": "a@example.com", "cc": ["b@example.com"]}, invoice, ORDER]
    assert sorted(seen, key=repr) == sorted(expected, key=repr)


def test_every_kind_of_field_comes_back_equal_through_jsonb(tables: sa.Engine) -> None:
    queue = JobQueue()
    seen: list[Parcel] = []

    @queue.task
    def send(ctx: JobContext, payload: Parcel) -> None:
        seen.append(payload)

    parcel = Parcel(
        ref=uuid.UUID(int=77),
        value=Decimal("12.50"),
        carrier=Carrier.COURIER,
        due=date(2026, 12, 1),
        lines=[Line("apple", 2)],
        weights={"box": 1.25},
        at=datetime(2026, 11, 27, 9, 30, 15, 123456, tzinfo=UTC),
    )
    with Session(tables) as session, session.begin():
        queue.enqueue(session, send, parcel)

    assert drain(queue, tables).succeeded == 1
    assert seen == [parcel]
    assert stored(tables)[0]["value"] == "12.50"  # a Decimal as text: no float rounding


def test_a_dataclass_or_model_may_be_given_as_a_dict_of_its_fields(tables: sa.Engine) -> None:
    seen: list[Any] = []
    queue = typed_queue(seen)
    with Session(tables) as session, session.begin():
        queue.enqueue_many(
            session,
            "ship",
            [{"order_id": 7, "placed_at": PLACED.isoformat(), "lines": [{"sku": "apple"}]}],
        )
        queue.enqueue(session, "bill", {"number": 1, "reference": str(uuid.UUID(int=1))})

    drain(queue, tables)

    assert seen == [
        Order(7, PLACED, [Line("apple")]),
        Invoice(number=1, reference=uuid.UUID(int=1)),
    ]


@pytest.mark.parametrize(
    ("task", "payload", "why"),
    [
        ("ship", Line("apple"), "payload should be Order or a dict of its fields, not Line"),
        (
            "ship",
            Order(7, PLACED, [Line("apple", "3")]),
            "payload.lines.0.quantity: Input should be a valid integer",
        ),  # type: ignore[arg-type]
        ("ship", {"order_id": 7, "lines": []}, "payload.placed_at: Field required"),
        ("mail", {"to": "a", "bcc": []}, "payload.bcc: Extra inputs are not permitted"),
        (
            "bill",
            {"number": "12", "reference": str(uuid.UUID(int=1))},
            "payload.number: Input should be a valid integer",
        ),
    ],
)
def test_a_payload_that_does_not_fit_is_refused_before_any_sql(
    tables: sa.Engine, sent_sql: list[str], task: str, payload: object, why: str
) -> None:
    queue = typed_queue([])
    with Session(tables) as session, session.begin():
        session.execute(sa.text("select 1"))  # the transaction has begun
        before = len(sent_sql)
        with pytest.raises(PayloadTypeError) as raised:
            queue.enqueue(session, task, payload)
        assert str(raised.value).startswith(f"task '{task}' takes a payload of type")
        assert why in str(raised.value)
        assert len(sent_sql) == before  # nothing sent
        queue.enqueue(session, "ship", ORDER)  # the transaction is still usable

    assert len(stored(tables)) == 1  # and it committed


def test_a_stored_payload_that_no_longer_fits_fails_and_follows_the_retry_policy(
    tables: sa.Engine,
) -> None:
    # Before the deploy: the task took a plain dict, and a job was enqueued with one.
    before = JobQueue()

    @before.task(name="ship", max_attempts=3, backoff=HOURLY)
    def ship_before(ctx: JobContext, payload: dict[str, Any]) -> None:
        raise AssertionError("not run here")

    with Session(tables) as session, session.begin():
        job_id = before.enqueue(session, ship_before, {"order_id": "7", "lines": []})

    # After it, the task takes an Order, which that payload does not fit.
    ran: list[Any] = []
    after = JobQueue()

    @after.task(name="ship", max_attempts=3, backoff=HOURLY)
    def ship(ctx: JobContext, payload: Order) -> None:
        ran.append(payload)

    first = drain(after, tables)
    assert (first.failed, first.dead) == (1, 0)  # to be retried after its backoff
    rest = drain(after, tables, with_retries=True)
    assert rest.dead == 1

    assert ran == []
    with tables.connect() as conn:
        row = conn.execute(
            sa.select(jobs_table.c.status, jobs_table.c.attempts, jobs_table.c.last_error).where(
                jobs_table.c.id == job_id
            )
        ).one()
    assert (row.status, row.attempts) == ("dead", 3)
    assert row.last_error["type"] == "sa_jobqueue.errors.PayloadTypeError"
    assert row.last_error["message"].startswith(
        "the stored payload of task 'ship' does not fit its type Order"
    )
    assert row.last_error["message"].endswith(
        "payload.order_id: Input should be a valid integer; payload.placed_at: Field required"
    )


def test_unique_key_gets_the_typed_value(tables: sa.Engine) -> None:
    queue = JobQueue()
    keys: list[Any] = []

    def key(order: Order) -> str:
        keys.append(order)
        return f"order-{order.order_id}"

    @queue.task(unique_key=key)
    def ship(ctx: JobContext, payload: Order) -> None:
        pass

    with Session(tables) as session, session.begin():
        first = queue.enqueue(session, ship, ORDER)
        again = queue.enqueue(
            session, "ship", {"order_id": 7, "placed_at": PLACED.isoformat(), "lines": []}
        )

    assert (first.created, again.created, int(again)) == (True, False, int(first))
    assert keys == [ORDER, Order(7, PLACED, [])]


def test_an_untyped_task_is_unchanged(tables: sa.Engine) -> None:
    queue = JobQueue()
    seen: list[Any] = []

    @queue.task
    def plain(ctx: JobContext, payload: dict[str, Any]) -> None:
        seen.append(payload)

    assert plain.payload_codec is None
    assert plain.payload_type is None
    with Session(tables) as session, session.begin():
        queue.enqueue(session, plain, {"anything": [1, "two", None]})

    drain(queue, tables)
    assert seen == [{"anything": [1, "two", None]}]


def test_workflow_calls_are_checked_and_rebuilt_as_well(tables: sa.Engine) -> None:
    seen: list[Any] = []
    queue = typed_queue(seen)
    with Session(tables) as session, session.begin():
        with pytest.raises(PayloadTypeError, match="task 'ship' takes a payload of type Order"):
            queue.chain(session, [Call("ship", Line("apple"))])
        queue.chain(session, [Call("ship", ORDER), Call("mail", Mail(to="a@example.com"))])

    assert drain(queue, tables).succeeded == 2
    assert seen == [ORDER, {"to": "a@example.com"}]
