"""Typed payloads: a handler's payload annotation, made into the codec that checks, stores and
rebuilds its payloads with Pydantic.

A task whose handler annotates its payload parameter with a dataclass, a ``TypedDict`` or a
Pydantic model gets a :class:`PayloadCodec`, built once at ``@queue.task`` around Pydantic's
``TypeAdapter`` of the type: ``enqueue`` checks the payload against the type and stores it as
JSON, and the worker rebuilds a value of the type before the handler runs. What a field may be
is what Pydantic supports. Any other annotation (none, ``Any``, ``dict[str, Any]``, ...) gives
no codec: the payload is plain JSON, as it always was, costs nothing more, and Pydantic is not
imported.

One rule for the three kinds, at enqueue and in the worker alike: the payload's JSON form is
validated by Pydantic in strict mode (``validate_json(..., strict=True, extra="forbid")``). So
a payload is accepted at enqueue exactly when a worker can rebuild it, and into the value the
handler will get; ``"3"`` is no ``int`` and ``True`` no ``int``, but a ``datetime``, ``UUID``
or ``Decimal`` may be given as its JSON text, as it is stored; keys the type does not declare
are refused. These settings override a model's own ``strict`` and ``extra`` configuration.

Internal: :class:`~sa_jobqueue.tasks.Task` holds the codec; no public import path.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import sys
import types
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import typing_extensions

from .errors import PayloadTypeError, TaskDefinitionError

if TYPE_CHECKING:
    from pydantic import TypeAdapter, ValidationError

#: How many of Pydantic's errors a PayloadTypeError spells out; it counts the others.
SHOWN_ERRORS = 3


class PayloadCodec:
    """How one task's typed payloads are checked at enqueue, stored, and rebuilt in a worker.

    Not a promise about what the handler then does with its payload: a value the handler
    mutates is its own.
    """

    __slots__ = ("adapter", "task", "type", "typed_dict")

    def __init__(self, task: str, kind: type, adapter: TypeAdapter[Any]) -> None:
        self.task = task
        #: The annotation: a dataclass, a TypedDict or a Pydantic model class.
        self.type = kind
        #: Pydantic's TypeAdapter of :attr:`type`, built once per task.
        self.adapter = adapter
        self.typed_dict = typing_extensions.is_typeddict(kind)

    def prepare(self, given: Any) -> tuple[Any, Any]:
        """The payload as the handler will get it, and as JSON data; PayloadTypeError if it does
        not fit. A dataclass or model may be given as a dict of its fields too (values as
        Python objects or as their JSON form)."""
        from pydantic_core import PydanticSerializationError, to_json

        heading = f"task {self.task!r} takes a payload of type {self.type.__name__}"
        if not isinstance(given, dict) and (self.typed_dict or not isinstance(given, self.type)):
            raise PayloadTypeError(
                f"{heading}: payload should be {self._expected()}, not {type(given).__name__}"
            )
        try:
            if isinstance(given, dict):
                # Every key as given: the type's own serialiser would drop the keys a TypedDict
                # does not declare, which the check must see to refuse.
                typed = self._validate(to_json(given, round_trip=True), heading)
                text = self._dump(typed)  # as a value of the type: its defaults filled in
            else:
                text = self._dump(given)
                typed = self._validate(text, heading)
        except PydanticSerializationError as exc:
            raise PayloadTypeError(f"{heading}: payload: {_one_line(str(exc))}") from exc
        return typed, json.loads(text)

    def rebuild(self, data: Any) -> Any:
        """The value a stored payload (JSON data) stands for; PayloadTypeError if it does not
        fit the type (any more: a deploy changed it since it was enqueued)."""
        from pydantic_core import to_json

        return self._validate(
            to_json(data),
            f"the stored payload of task {self.task!r} does not fit its type"
            f" {self.type.__name__} (changed since it was enqueued?)",
        )

    def _dump(self, value: Any) -> bytes:
        # warnings=False: a field holding a value of another type is written as it is, and the
        # validation that follows says where, which a serialiser warning would not.
        return self.adapter.dump_json(
            value, by_alias=True, round_trip=True, exclude_computed_fields=True, warnings=False
        )

    def _validate(self, text: bytes, heading: str) -> Any:
        from pydantic import ValidationError

        try:
            return self.adapter.validate_json(text, strict=True, extra="forbid")
        except ValidationError as exc:
            raise PayloadTypeError(f"{heading}: {misfits(exc)}") from exc

    def _expected(self) -> str:
        name = self.type.__name__
        return f"a dict ({name})" if self.typed_dict else f"{name} or a dict of its fields"


def misfits(exc: ValidationError) -> str:
    """Pydantic's errors on one line, each at its path: ``payload.lines.0.quantity: Input
    should be a valid integer``."""
    errors = exc.errors(include_url=False, include_context=False, include_input=False)
    shown = [
        f"{'.'.join(['payload', *map(str, error['loc'])])}: {_one_line(error['msg'])}"
        for error in errors[:SHOWN_ERRORS]
    ]
    if len(errors) > SHOWN_ERRORS:
        shown.append(f"and {len(errors) - SHOWN_ERRORS} more")
    return "; ".join(shown)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def codec_for(
    task: str, handler: Callable[..., object], *, batch: bool = False
) -> PayloadCodec | None:
    """The codec for ``handler``'s payload annotation, or None when it names no dataclass,
    TypedDict or Pydantic model (the payload is plain JSON then).

    ``batch``: a batch task's handler, whose second parameter is a list of jobs annotated
    ``list[BatchJob[T]]`` (or any ``Sequence``): the payload type is that ``T``.

    An annotation given as text (``from __future__ import annotations``) is resolved in the
    handler's module; one that cannot be resolved there (a name imported only under
    ``TYPE_CHECKING``, a class local to a function) gives no codec. TaskDefinitionError when
    Pydantic is not installed, or cannot validate the type (a field of a type it does not
    support, a name its fields use that cannot be resolved).
    """
    try:
        parameters = list(inspect.signature(handler).parameters.values())
    except (TypeError, ValueError):
        return None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if len(parameters) < 2 or parameters[1].kind not in positional:
        return None
    kind = parameters[1].annotation
    if isinstance(kind, str):
        kind = _resolve(kind, handler)
    if typing.get_origin(kind) is typing.Annotated:
        kind = typing.get_args(kind)[0]
    if batch:
        kind = _job_payload(kind)
    if not _is_record(kind):
        return None
    return PayloadCodec(task, kind, _adapter(task, kind))


def _job_payload(jobs: object) -> object:
    """``T`` of ``list[BatchJob[T]]`` (or of any generic sequence of a generic job); None
    when ``jobs`` is not annotated so."""
    outer = typing.get_args(jobs)
    if len(outer) != 1:
        return None
    inner = typing.get_args(outer[0])
    return inner[0] if len(inner) == 1 else None


def _adapter(task: str, kind: type) -> TypeAdapter[Any]:
    """Pydantic's TypeAdapter of ``kind``, complete (every name its fields use resolved)."""
    where = f"task {task!r}: its payload type {kind.__name__}"
    try:
        import pydantic
    except ImportError:
        raise TaskDefinitionError(
            f"{where} is checked and rebuilt by Pydantic, which is not installed: pip install"
            " 'sa_jobqueue[pydantic]', or annotate the payload as dict[str, Any] or Any"
        ) from None
    try:
        adapter: TypeAdapter[Any] = pydantic.TypeAdapter(kind)
        if not adapter.pydantic_complete:  # Pydantic defers names it cannot resolve yet
            adapter.rebuild(raise_errors=True)
    except pydantic.PydanticUndefinedAnnotation as exc:
        raise TaskDefinitionError(f"{where} uses a name that cannot be resolved: {exc}") from exc
    except pydantic.PydanticUserError as exc:
        # A field of a type Pydantic cannot validate, or a typing.TypedDict on Python 3.11.
        first = str(exc).strip().splitlines()[0]
        raise TaskDefinitionError(f"{where} cannot be validated by Pydantic: {first}") from exc
    return adapter


def _is_record(kind: object) -> bool:
    """Whether ``kind`` makes a codec: a dataclass, a TypedDict or a Pydantic model class.

    Pydantic is not imported to tell: a model class exists only once it is.
    """
    if not isinstance(kind, type):
        return False
    if dataclasses.is_dataclass(kind) or typing_extensions.is_typeddict(kind):
        return True
    pydantic = sys.modules.get("pydantic")
    return (
        pydantic is not None
        and issubclass(kind, pydantic.BaseModel)
        and kind is not pydantic.BaseModel
    )


def _resolve(text: str, handler: Callable[..., object]) -> object:
    """The annotation ``text`` stands for in ``handler``'s module; None if it names nothing
    there. Only this one annotation is resolved: ``ctx``'s may be importable only under
    ``TYPE_CHECKING``, which typing.get_type_hints on the whole handler would trip over."""
    namespace = getattr(inspect.unwrap(handler), "__globals__", {})
    # What typing.get_type_hints does with each annotation it is given as text.
    holder = types.SimpleNamespace(__annotations__={"payload": text})
    try:
        return typing.get_type_hints(holder, globalns=namespace)["payload"]
    except Exception:  # NameError, or text that is no expression
        return None
