"""Typed payloads without a database: which annotations make a codec, what it stores and
rebuilds, what it refuses, and run_task with typed tasks."""

from __future__ import annotations

import enum
import json
import uuid
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Annotated, Any, Literal, NotRequired, TypedDict

import pydantic
import pytest

from sa_jobqueue import JobContext, JobQueue
from sa_jobqueue.errors import PayloadError, PayloadTypeError, TaskDefinitionError
from sa_jobqueue.testing import run_task

if TYPE_CHECKING:
    from collections.abc import Callable

    from sa_jobqueue.tasks import JobContext as CheckedContext  # no such name at run time


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclass
class Part:
    name: str
    colour: Colour = Colour.RED


@dataclass
class Everything:
    text: str
    count: int
    ratio: float
    flag: bool
    at: datetime
    day: date
    ref: uuid.UUID
    price: Decimal
    kind: Literal["a", "b"]
    parts: list[Part]
    scores: dict[str, int]
    maybe: Part | None = None
    anything: Any = None
    tags: list[str] = field(default_factory=list)


class Mail(TypedDict):
    to: str
    cc: NotRequired[list[str]]
    part: NotRequired[Part]


class Model(pydantic.BaseModel):
    number: int
    part: Part | None = None


@dataclass
class Tree:
    label: str
    children: list[Tree] = field(default_factory=list)


@dataclass
class Numbers:
    whole: int
    real: float


@dataclass
class WithSet:
    items: set[int]


@dataclass
class Ticked:
    report: str
    tick: datetime


def task_of(handler: Callable[..., object], **options: Any) -> Any:
    return JobQueue().task(**options)(handler)


def everything() -> Everything:
    return Everything(
        text="t",
        count=3,
        ratio=0.5,
        flag=True,
        at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        day=date(2026, 1, 2),
        ref=uuid.UUID(int=9),
        price=Decimal("1.10"),
        kind="b",
        parts=[Part("wheel", Colour.BLUE), Part("seat")],
        scores={"x": 1},
        maybe=Part("bell"),
        anything={"free": [1, 2]},
    )


def test_every_supported_field_goes_to_json_and_back() -> None:
    def handler(ctx: JobContext, payload: Everything) -> None: ...

    codec = task_of(handler).payload_codec
    value = everything()
    typed, data = codec.prepare(value)

    assert typed is value
    assert data == {
        "text": "t",
        "count": 3,
        "ratio": 0.5,
        "flag": True,
        "at": "2026-01-02T03:04:05+00:00",
        "day": "2026-01-02",
        "ref": "00000000-0000-0000-0000-000000000009",
        "price": "1.10",
        "kind": "b",
        "parts": [{"name": "wheel", "colour": "blue"}, {"name": "seat", "colour": "red"}],
        "scores": {"x": 1},
        "maybe": {"name": "bell", "colour": "red"},
        "anything": {"free": [1, 2]},
        "tags": [],
    }
    assert codec.rebuild(json.loads(json.dumps(data))) == value


def test_annotations_that_make_no_codec_leave_the_payload_plain() -> None:
    def untyped(ctx, payload):  # type: ignore[no-untyped-def]
        ...

    def plain(ctx: JobContext, payload: dict[str, Any]) -> None: ...

    def anything(ctx: JobContext, payload: Any) -> None: ...

    def optional(ctx: JobContext, payload: Part | None) -> None: ...

    for handler in (untyped, plain, anything, optional):
        task = task_of(handler)
        assert (task.payload_codec, task.payload_type) == (None, None)


def test_text_annotations_are_resolved_in_the_handlers_module() -> None:
    # This module has `from __future__ import annotations`: every annotation here is text.
    def handler(ctx: JobContext, payload: Annotated[Part, "meta"]) -> None: ...

    assert task_of(handler).payload_type is Part


def test_only_the_payload_annotation_needs_resolving() -> None:
    def handler(ctx: CheckedContext, payload: Part) -> None: ...

    assert task_of(handler).payload_type is Part


def test_an_annotation_that_cannot_be_resolved_leaves_the_payload_plain() -> None:
    @dataclass
    class Local:  # a class local to a function: its name is not in the module
        n: int

    def handler(ctx: JobContext, payload: Local) -> None: ...

    assert task_of(handler).payload_codec is None


def test_a_type_referring_to_itself_is_supported() -> None:
    def handler(ctx: JobContext, payload: Tree) -> None: ...

    tree = Tree("root", [Tree("leaf")])
    codec = task_of(handler).payload_codec
    _, data = codec.prepare(tree)
    assert data == {"label": "root", "children": [{"label": "leaf", "children": []}]}
    assert codec.rebuild(data) == tree


def test_a_field_of_an_unsupported_type_is_refused_at_declaration() -> None:
    def handler(ctx: JobContext, payload: WithSet) -> None: ...

    with pytest.raises(TaskDefinitionError, match=r"payload type WithSet has a field of type"):
        task_of(handler)


def test_a_typed_dict_keeps_its_optional_keys_optional() -> None:
    def handler(ctx: JobContext, payload: Mail) -> None: ...

    codec = task_of(handler).payload_codec
    assert codec.prepare({"to": "a"}) == ({"to": "a"}, {"to": "a"})
    _, data = codec.prepare({"to": "a", "part": Part("p")})
    assert data == {"to": "a", "part": {"name": "p", "colour": "red"}}
    assert codec.rebuild(data) == {"to": "a", "part": Part("p")}


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        ({"to": 1}, "payload.to should be str, not int 1"),
        ({}, "payload lacks the required keys ['to'] of Mail"),
        ({"to": "a", "cc": "b"}, "payload.cc should be a list, not str 'b'"),
        ({"to": "a", "bcc": []}, "payload has keys Mail does not declare: ['bcc']"),
        (["to"], "payload should be a dict (Mail), not list"),
    ],
)
def test_what_does_not_fit_is_refused_with_its_path(payload: Any, why: str) -> None:
    def handler(ctx: JobContext, payload: Mail) -> None: ...

    with pytest.raises(PayloadTypeError) as raised:
        task_of(handler).payload_codec.prepare(payload)
    assert str(raised.value).startswith("task 'handler' takes a payload of type Mail: ")
    assert why in str(raised.value)
    assert isinstance(raised.value, PayloadError)  # an InvalidJobError: refused before any SQL


@pytest.mark.parametrize(
    ("stored", "why"),
    [
        ({"name": 1}, "payload.name should be str, not int 1"),
        ({"name": "a", "colour": "green"}, "payload.colour is no value of Colour: str 'green'"),
        ({"name": "a", "weight": 2}, "has keys Part does not declare: ['weight']"),
    ],
)
def test_a_stored_payload_that_no_longer_fits_says_so(stored: Any, why: str) -> None:
    def handler(ctx: JobContext, payload: Part) -> None: ...

    with pytest.raises(PayloadTypeError) as raised:
        task_of(handler).payload_codec.rebuild(stored)
    assert str(raised.value).startswith(
        "the stored payload of task 'handler' does not fit its type Part"
    )
    assert why in str(raised.value)


def test_a_bool_is_no_int_and_an_int_is_a_float() -> None:
    def handler(ctx: JobContext, payload: Numbers) -> None: ...

    codec = task_of(handler).payload_codec
    assert codec.rebuild({"whole": 1, "real": 2}) == Numbers(1, 2.0)
    assert type(codec.rebuild({"whole": 1, "real": 2}).real) is float
    with pytest.raises(PayloadTypeError, match=r"payload\.whole should be int, not bool True"):
        codec.rebuild({"whole": True, "real": 2.0})
    with pytest.raises(PayloadTypeError, match=r"payload\.real should be float, not bool False"):
        codec.prepare(Numbers(1, False))


def test_a_pydantic_model_is_validated_by_pydantic() -> None:
    def handler(ctx: JobContext, payload: Model) -> None: ...

    codec = task_of(handler).payload_codec
    model = Model(number=1, part=Part("p"))
    assert codec.prepare(model) == (model, {"number": 1, "part": {"name": "p", "colour": "red"}})
    assert codec.prepare({"number": 2}) == (Model(number=2), {"number": 2, "part": None})
    with pytest.raises(PayloadTypeError, match="payload is not a valid Model"):
        codec.prepare({"number": "two"})


def test_run_task_checks_and_rebuilds_a_typed_payload() -> None:
    seen: list[Any] = []

    def handler(ctx: JobContext, payload: Everything) -> str:
        seen.append(payload)
        return "done"

    task = task_of(handler)
    assert run_task(task, everything()) == "done"
    assert run_task(task, task.payload_codec.prepare(everything())[1]) == "done"  # as a dict
    assert seen == [everything(), everything()]
    assert seen[0] is not everything()  # rebuilt from its JSON, as a worker would
    with pytest.raises(PayloadTypeError):
        run_task(task, Part("p"))


def test_run_task_rebuilds_for_an_async_handler_too() -> None:
    seen: list[Any] = []

    async def handler(ctx: JobContext, payload: Part) -> None:
        seen.append(payload)

    run_task(task_of(handler), {"name": "p"})
    assert seen == [Part("p")]


def test_a_periodic_schedule_must_give_a_payload_that_fits() -> None:
    queue = JobQueue()

    @queue.periodic("0 3 * * *", payload={"report": "daily"})
    @queue.task
    def nightly(ctx: JobContext, payload: Ticked) -> None: ...

    assert queue.schedules["nightly"].task is nightly

    refused = r"schedule 'part': task 'part' takes a payload of type Part: .* \['tick'\]"
    with pytest.raises(TaskDefinitionError, match=refused):

        @queue.periodic("0 3 * * *", payload={"colour": "red"})
        @queue.task
        def part(ctx: JobContext, payload: Part) -> None: ...
