"""Typed payloads: a handler's payload annotation, made into the codec that checks, stores and
rebuilds its payloads.

A task whose handler annotates its payload parameter with a dataclass, a ``TypedDict`` or a
Pydantic model gets a :class:`PayloadCodec`: ``enqueue`` checks the payload against the type
and stores it as JSON, and the worker rebuilds a value of the type before the handler runs.
Any other annotation (none, ``Any``, ``dict[str, Any]``, ...) gives no codec: the payload is
plain JSON, as it always was, and costs nothing more.

Dataclasses and TypedDicts are converted here, with no dependency, and the same way whether
Pydantic is installed or not. Their fields may be: ``str``, ``int``, ``float`` (an int is
taken), ``bool``, ``None``, ``datetime``, ``date`` (ISO 8601 text), ``UUID`` and ``Decimal``
(text), an ``Enum`` (its value), a ``Literal``, ``list[T]``, ``dict[str, T]``, a union such as
``T | None`` (its members tried in order), ``Any`` (plain JSON, as is), and nested dataclasses,
TypedDicts and Pydantic models. Anything else is refused at ``@queue.task``. A dataclass's
fields with ``init=False`` are not stored. Keys the type does not declare are refused, both at
enqueue and when a stored payload is rebuilt. Pydantic models are validated and dumped by
Pydantic (``model_validate``, ``model_dump(mode="json")``); Pydantic is imported only by
whoever declares a model.

The conversions themselves are in :mod:`sa_jobqueue._payload_conversions`. Internal:
:class:`~sa_jobqueue.tasks.Task` holds the codec; no public import path.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from typing import Any

from ._payload_conversions import Conversion, Misfit, Unsupported, conversion, is_record
from .errors import PayloadTypeError, TaskDefinitionError


class PayloadCodec:
    """How one task's typed payloads are checked at enqueue, stored, and rebuilt in a worker.

    Not a promise about what the handler then does with its payload: a value the handler
    mutates is its own.
    """

    __slots__ = ("root", "task", "type")

    def __init__(self, task: str, kind: type, root: Conversion) -> None:
        self.task = task
        #: The annotation: a dataclass, a TypedDict or a Pydantic model class.
        self.type = kind
        #: The conversion of :attr:`type`.
        self.root = root

    def prepare(self, given: Any) -> tuple[Any, Any]:
        """The payload as the handler will get it, and as JSON data; PayloadTypeError if it does
        not fit. A dataclass or model may be given as a dict of its fields too."""
        try:
            if isinstance(given, dict) and not typing.is_typeddict(self.type):
                given = self.root.load(given, "payload")
            return given, self.root.dump(given, "payload")
        except Misfit as exc:
            raise PayloadTypeError(
                f"task {self.task!r} takes a payload of type {self.type.__name__}: {exc}"
            ) from None

    def rebuild(self, data: Any) -> Any:
        """The value a stored payload (JSON data) stands for; PayloadTypeError if it does not
        fit the type (any more: a deploy changed it since it was enqueued)."""
        try:
            return self.root.load(data, "payload")
        except Misfit as exc:
            raise PayloadTypeError(
                f"the stored payload of task {self.task!r} does not fit its type"
                f" {self.type.__name__} (changed since it was enqueued?): {exc}"
            ) from None


def codec_for(task: str, handler: Callable[..., object]) -> PayloadCodec | None:
    """The codec for ``handler``'s payload annotation, or None when it names no dataclass,
    TypedDict or Pydantic model (the payload is plain JSON then).

    An annotation given as text (``from __future__ import annotations``) is resolved in the
    handler's module; one that cannot be resolved there (a name imported only under
    ``TYPE_CHECKING``, a class local to a function) gives no codec. A field of a type the codec
    cannot store raises TaskDefinitionError.
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
    if not is_record(kind):
        return None
    try:
        root = conversion(kind, {})
    except Unsupported as exc:
        raise TaskDefinitionError(
            f"task {task!r}: its payload type {kind.__name__} has a field of type {exc}, which"
            " a typed payload cannot store (see the typed payloads how-to for the types it can)"
        ) from None
    except NameError as exc:
        raise TaskDefinitionError(
            f"task {task!r}: the fields of its payload type {kind.__name__} cannot be resolved:"
            f" {exc}"
        ) from None
    return PayloadCodec(task, kind, root)


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
