"""Typed payloads without a database: which annotations make a codec, what it stores and
rebuilds, what it refuses, and run_task with typed tasks."""

from __future__ import annotations

import enum
import json
import sys
import typing
import uuid
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Annotated, Any, Literal, NotRequired

import pydantic
import pytest
from typing_extensions import TypedDict

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
class WithSet:  # Pydantic stores a set as a JSON array
    items: set[int]


class Opaque:
    """A class Pydantic knows no schema for."""


@dataclass
class WithOpaque:
    thing: Opaque


@dataclass
class WithUnknownName:
    other: NoSuchName  # type: ignore[name-defined]  # noqa: F821


class LaxModel(pydantic.BaseModel):
    """Its own config says lax and extra keys ignored; typed payloads are strict all the same."""

    model_config = pydantic.ConfigDict(strict=False, extra="ignore")
    number: int


@dataclass
class Lines:
    lines: list[Part]


@dataclass
class Counted:
    name: str
    length: int = field(init=False, default=0)


@dataclass
class CountedExcluded:
    name: str
    length: Annotated[int, pydantic.Field(exclude=True)] = field(init=False, default=0)


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

    assert typed == value  # what a worker rebuilds from data, which unique_key gets too
    assert data == {
        "text": "t",
        "count": 3,
        "ratio": 0.5,
        "flag": True,
        "at": "2026-01-02T03:04:05Z",
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


def test_what_pydantic_supports_is_supported() -> None:
    def handler(ctx: JobContext, payload: WithSet) -> None: ...

    codec = task_of(handler).payload_codec
    _, data = codec.prepare(WithSet({3, 1}))
    assert sorted(data["items"]) == [1, 3]
    assert codec.rebuild(data) == WithSet({1, 3})


def test_a_field_of_a_type_pydantic_cannot_validate_is_refused_at_declaration() -> None:
    def handler(ctx: JobContext, payload: WithOpaque) -> None: ...

    with pytest.raises(TaskDefinitionError) as raised:
        task_of(handler)
    assert str(raised.value).startswith(
        "task 'handler': its payload type WithOpaque cannot be validated by Pydantic:"
        " Unable to generate pydantic-core schema for <class"
    )
    assert "\n" not in str(raised.value)
    assert isinstance(raised.value.__cause__, pydantic.PydanticUserError)


def test_a_field_naming_what_cannot_be_resolved_is_refused_at_declaration() -> None:
    def handler(ctx: JobContext, payload: WithUnknownName) -> None: ...

    with pytest.raises(
        TaskDefinitionError,
        match=r"payload type WithUnknownName uses a name that cannot be resolved: .*NoSuchName",
    ):
        task_of(handler)


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="Pydantic takes typing.TypedDict on 3.12+")
def test_a_typing_typed_dict_is_refused_on_python_3_11() -> None:
    class Plain(typing.TypedDict):
        to: str

    def handler(ctx: JobContext, payload: Plain) -> None: ...

    handler.__annotations__["payload"] = Plain  # resolved: the class is local
    with pytest.raises(TaskDefinitionError, match=r"Please use `typing_extensions.TypedDict`"):
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
        ({"to": 1}, "payload.to: Input should be a valid string"),
        ({}, "payload.to: Field required"),
        ({"to": "a", "cc": "b"}, "payload.cc: Input should be a valid array"),
        ({"to": "a", "bcc": []}, "payload.bcc: Extra inputs are not permitted"),
        (["to"], "payload should be a dict (Mail), not list"),
    ],
)
def test_what_does_not_fit_is_refused_with_its_path(payload: Any, why: str) -> None:
    def handler(ctx: JobContext, payload: Mail) -> None: ...

    with pytest.raises(PayloadTypeError) as raised:
        task_of(handler).payload_codec.prepare(payload)
    assert str(raised.value) == f"task 'handler' takes a payload of type Mail: {why}"
    assert isinstance(raised.value, PayloadError)  # an InvalidJobError: refused before any SQL


@pytest.mark.parametrize(
    ("stored", "why"),
    [
        ({"name": 1}, "payload.name: Input should be a valid string"),
        ({"name": "a", "colour": "green"}, "payload.colour: Input should be 'red' or 'blue'"),
        ({"name": "a", "weight": 2}, "payload.weight: Unexpected keyword argument"),
        ([], "payload: Input should be an object"),
    ],
)
def test_a_stored_payload_that_no_longer_fits_says_so(stored: Any, why: str) -> None:
    def handler(ctx: JobContext, payload: Part) -> None: ...

    with pytest.raises(PayloadTypeError) as raised:
        task_of(handler).payload_codec.rebuild(stored)
    assert str(raised.value) == (
        "the stored payload of task 'handler' does not fit its type Part"
        f" (changed since it was enqueued?): {why}"
    )
    assert isinstance(raised.value.__cause__, pydantic.ValidationError)


def test_a_payload_stored_before_pydantic_did_the_conversions_is_rebuilt() -> None:
    def handler(ctx: JobContext, payload: Everything) -> None: ...

    codec = task_of(handler).payload_codec
    _, data = codec.prepare(everything())
    # The previous codec wrote datetime.isoformat(): +00:00 rather than Z.
    assert codec.rebuild({**data, "at": "2026-01-02T03:04:05+00:00"}) == everything()


def test_a_bool_is_no_int_and_an_int_is_a_float() -> None:
    def handler(ctx: JobContext, payload: Numbers) -> None: ...

    codec = task_of(handler).payload_codec
    assert codec.rebuild({"whole": 1, "real": 2}) == Numbers(1, 2.0)
    assert type(codec.rebuild({"whole": 1, "real": 2}).real) is float
    with pytest.raises(PayloadTypeError, match=r"payload\.whole: Input should be a valid integer"):
        codec.rebuild({"whole": True, "real": 2.0})
    with pytest.raises(PayloadTypeError, match=r"payload\.real: Input should be a valid number"):
        codec.prepare({"whole": 1, "real": False})


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (Numbers("3", 1.0), "payload.whole: Input should be a valid integer"),  # type: ignore[arg-type]
        ({"whole": "3", "real": 1.0}, "payload.whole: Input should be a valid integer"),
        ({"whole": 3, "real": "1.5"}, "payload.real: Input should be a valid number"),
        (Lines([Part("a"), Part(["b"])]), "payload.lines.1.name: Input should be a valid string"),  # type: ignore[arg-type]
        ({"lines": [{"name": "a", "colour": "green"}]}, "payload.lines.0.colour: Input should be"),
    ],
)
def test_enqueue_is_strict_whether_given_an_instance_or_a_dict(payload: Any, why: str) -> None:
    # A dataclass instance is not checked when made: the codec checks its fields all the same.
    def numbers(ctx: JobContext, payload: Numbers) -> None: ...

    def lines(ctx: JobContext, payload: Lines) -> None: ...

    task = task_of(lines if "lines" in str(why) else numbers)
    with pytest.raises(PayloadTypeError) as raised:
        task.payload_codec.prepare(payload)
    assert why in str(raised.value)


def test_an_instance_of_another_type_is_refused_by_name() -> None:
    def handler(ctx: JobContext, payload: Numbers) -> None: ...

    with pytest.raises(PayloadTypeError) as raised:
        task_of(handler).payload_codec.prepare(Part("p"))
    assert str(raised.value) == (
        "task 'handler' takes a payload of type Numbers:"
        " payload should be Numbers or a dict of its fields, not Part"
    )


def test_a_dict_of_fields_may_hold_values_or_their_json_text() -> None:
    def handler(ctx: JobContext, payload: Everything) -> None: ...

    codec = task_of(handler).payload_codec
    _, data = codec.prepare(everything())
    as_objects = {
        **data,
        "at": everything().at,
        "ref": uuid.UUID(int=9),
        "price": Decimal("1.10"),
        "parts": everything().parts,
    }
    for given in (data, as_objects):
        assert codec.prepare(given) == (everything(), data)


def test_an_error_message_is_one_line_and_counts_what_it_does_not_show() -> None:
    def handler(ctx: JobContext, payload: Everything) -> None: ...

    with pytest.raises(PayloadTypeError) as raised:
        task_of(handler).payload_codec.prepare({"text": 1, "count": "2", "flag": 0})
    assert str(raised.value) == (
        "task 'handler' takes a payload of type Everything:"
        " payload.text: Input should be a valid string;"
        " payload.count: Input should be a valid integer;"
        " payload.ratio: Field required; and 8 more"
    )
    assert isinstance(raised.value.__cause__, pydantic.ValidationError)


def test_a_pydantic_model_is_held_to_the_same_rule() -> None:
    def handler(ctx: JobContext, payload: Model) -> None: ...

    codec = task_of(handler).payload_codec
    model = Model(number=1, part=Part("p"))
    assert codec.prepare(model) == (model, {"number": 1, "part": {"name": "p", "colour": "red"}})
    assert codec.prepare({"number": 2}) == (Model(number=2), {"number": 2, "part": None})
    with pytest.raises(PayloadTypeError, match=r"payload\.number: Input should be a valid integer"):
        codec.prepare({"number": "two"})


def test_a_models_own_lax_config_does_not_loosen_the_rule() -> None:
    def handler(ctx: JobContext, payload: LaxModel) -> None: ...

    codec = task_of(handler).payload_codec
    assert LaxModel.model_validate({"number": "3", "other": 1}) == LaxModel(number=3)
    with pytest.raises(PayloadTypeError, match=r"payload\.number: Input should be a valid integer"):
        codec.prepare({"number": "3"})
    with pytest.raises(PayloadTypeError, match=r"payload\.other: Extra inputs are not permitted"):
        codec.prepare({"number": 3, "other": 1})
    assert codec.prepare(LaxModel(number="3")) == (LaxModel(number=3), {"number": 3})  # type: ignore[arg-type]


def test_a_dataclass_field_with_init_false_must_be_excluded_from_the_payload() -> None:
    # Pydantic writes the field, then refuses it on the way back (__init__ does not take it).
    def counted(ctx: JobContext, payload: Counted) -> None: ...

    def excluded(ctx: JobContext, payload: CountedExcluded) -> None: ...

    with pytest.raises(PayloadTypeError, match=r"payload\.length: Unexpected keyword argument"):
        task_of(counted).payload_codec.prepare(Counted("a"))
    assert task_of(excluded).payload_codec.prepare(CountedExcluded("a")) == (
        CountedExcluded("a"),
        {"name": "a"},
    )


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

    refused = r"schedule 'part': task 'part' takes a payload of type Part: .*payload\.tick: Unexp"
    with pytest.raises(TaskDefinitionError, match=refused):

        @queue.periodic("0 3 * * *", payload={"colour": "red"})
        @queue.task
        def part(ctx: JobContext, payload: Part) -> None: ...
