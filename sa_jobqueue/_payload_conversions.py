"""The conversions behind typed payloads: each supported type to JSON data and back.

Dataclasses and TypedDicts are converted here, with no dependency, and the same way whether
Pydantic is installed or not; Pydantic models by Pydantic. See :mod:`sa_jobqueue._payload_types`
for the types supported and how a task gets its conversion. Internal.
"""

from __future__ import annotations

import dataclasses
import enum
import sys
import types
import typing
import uuid
from collections.abc import Callable
from datetime import date, datetime
from decimal import Decimal, InvalidOperation
from typing import Any


class Misfit(Exception):
    """A value that does not fit its type, at ``path`` (``payload.items[2].sku``)."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path} {why}")


def _shown(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


class Conversion:
    """One type's conversion: ``dump`` a value of it to JSON data, ``load`` it back."""

    def dump(self, value: Any, path: str) -> Any:
        raise NotImplementedError

    def load(self, data: Any, path: str) -> Any:
        raise NotImplementedError


class _Plain(Conversion):
    """JSON as is (``Any``, ``object``): checked by the payload encoder later, not here."""

    def dump(self, value: Any, path: str) -> Any:
        return value

    def load(self, data: Any, path: str) -> Any:
        return data


class _Exact(Conversion):
    """str, bool, int and None: the JSON value itself, of exactly that type."""

    def __init__(self, kind: type) -> None:
        self.kind = kind

    def dump(self, value: Any, path: str) -> Any:
        # bool is an int: an int field takes no True, a bool field no 1.
        if type(value) is not self.kind:
            raise Misfit(path, f"should be {self.kind.__name__}, not {_shown(value)}")
        return value

    def load(self, data: Any, path: str) -> Any:
        return self.dump(data, path)


class _Float(Conversion):
    def dump(self, value: Any, path: str) -> Any:
        if type(value) not in (int, float):
            raise Misfit(path, f"should be float, not {_shown(value)}")
        return float(value)

    def load(self, data: Any, path: str) -> Any:
        return self.dump(data, path)


class _Text(Conversion):
    """A type stored as text: datetime, date, UUID, Decimal."""

    def __init__(self, kind: type, parse: Callable[[str], Any], show: Callable[[Any], str]):
        self.kind, self.parse, self.show = kind, parse, show

    def dump(self, value: Any, path: str) -> Any:
        # A datetime is a date: a date field takes none.
        if not isinstance(value, self.kind) or (self.kind is date and isinstance(value, datetime)):
            raise Misfit(path, f"should be {self.kind.__name__}, not {_shown(value)}")
        return self.show(value)

    def load(self, data: Any, path: str) -> Any:
        if isinstance(data, self.kind) and not isinstance(data, str):
            self.dump(data, path)  # a dict given at enqueue may hold one already
            return data
        if isinstance(data, str):
            try:
                value = self.parse(data)
            except (ValueError, InvalidOperation):
                pass
            else:
                if self.kind is not date or not isinstance(value, datetime):
                    return value
        raise Misfit(path, f"should be {self.kind.__name__} text, not {_shown(data)}")


class _Enum(Conversion):
    def __init__(self, kind: type[enum.Enum]) -> None:
        self.kind = kind

    def dump(self, value: Any, path: str) -> Any:
        if not isinstance(value, self.kind):
            raise Misfit(path, f"should be {self.kind.__name__}, not {_shown(value)}")
        return value.value

    def load(self, data: Any, path: str) -> Any:
        try:
            return self.kind(data)
        except ValueError:
            raise Misfit(path, f"is no value of {self.kind.__name__}: {_shown(data)}") from None


class _Literal(Conversion):
    def __init__(self, values: tuple[Any, ...]) -> None:
        self.values = values

    def dump(self, value: Any, path: str) -> Any:
        if not any(type(value) is type(v) and value == v for v in self.values):
            raise Misfit(path, f"should be one of {self.values!r}, not {_shown(value)}")
        return value

    def load(self, data: Any, path: str) -> Any:
        return self.dump(data, path)


class _List(Conversion):
    def __init__(self, item: Conversion) -> None:
        self.item = item

    def dump(self, value: Any, path: str) -> Any:
        if type(value) is not list:
            raise Misfit(path, f"should be a list, not {_shown(value)}")
        return [self.item.dump(v, f"{path}[{i}]") for i, v in enumerate(value)]

    def load(self, data: Any, path: str) -> Any:
        if type(data) is not list:
            raise Misfit(path, f"should be a list, not {_shown(data)}")
        return [self.item.load(v, f"{path}[{i}]") for i, v in enumerate(data)]


class _Dict(Conversion):
    """``dict[str, T]``."""

    def __init__(self, item: Conversion) -> None:
        self.item = item

    def _each(self, value: Any, path: str, convert: Callable[[Any, str], Any]) -> Any:
        if not isinstance(value, dict):
            raise Misfit(path, f"should be a dict, not {_shown(value)}")
        out = {}
        for key, item in value.items():
            if type(key) is not str:
                raise Misfit(path, f"has the key {key!r}, which is not a str")
            out[key] = convert(item, f"{path}[{key!r}]")
        return out

    def dump(self, value: Any, path: str) -> Any:
        return self._each(value, path, self.item.dump)

    def load(self, data: Any, path: str) -> Any:
        return self._each(data, path, self.item.load)


class _Union(Conversion):
    """Its members tried in order; the first that fits wins."""

    def __init__(self, members: list[Conversion], name: str) -> None:
        self.members, self.name = members, name

    def _first(self, value: Any, path: str, load: bool) -> Any:
        for member in self.members:
            try:
                return member.load(value, path) if load else member.dump(value, path)
            except Misfit:
                continue
        raise Misfit(path, f"fits none of {self.name}: {_shown(value)}")

    def dump(self, value: Any, path: str) -> Any:
        return self._first(value, path, load=False)

    def load(self, data: Any, path: str) -> Any:
        return self._first(data, path, load=True)


class _Fields(Conversion):
    """A dataclass or a TypedDict: its fields by name (filled in after creation, so that a
    type may refer to itself)."""

    def __init__(self, kind: type, typed_dict: bool) -> None:
        self.kind, self.typed_dict = kind, typed_dict
        self.fields: dict[str, Conversion] = {}
        self.required: frozenset[str] = frozenset()

    def dump(self, value: Any, path: str) -> Any:
        if self.typed_dict:
            if not isinstance(value, dict):
                raise Misfit(path, f"should be a dict ({self.kind.__name__}), not {_shown(value)}")
            self._check_keys(value, path)
            return {k: self.fields[k].dump(v, f"{path}.{k}") for k, v in value.items()}
        if not isinstance(value, self.kind):
            raise Misfit(path, f"should be {self.kind.__name__}, not {_shown(value)}")
        return {k: node.dump(getattr(value, k), f"{path}.{k}") for k, node in self.fields.items()}

    def load(self, data: Any, path: str) -> Any:
        if self.typed_dict or not isinstance(data, self.kind):
            if not isinstance(data, dict):
                raise Misfit(path, f"should be a dict ({self.kind.__name__}), not {_shown(data)}")
            self._check_keys(data, path)
        else:
            self.dump(data, path)  # a dict given at enqueue may hold one already
            return data
        values = {k: self.fields[k].load(v, f"{path}.{k}") for k, v in data.items()}
        if self.typed_dict:
            return values
        try:
            return self.kind(**values)
        except Exception as exc:  # its __post_init__ refused the values
            raise Misfit(path, f"could not be made a {self.kind.__name__}: {exc}") from None

    def _check_keys(self, data: dict[Any, Any], path: str) -> None:
        unknown = [k for k in data if k not in self.fields]
        if unknown:
            raise Misfit(path, f"has keys {self.kind.__name__} does not declare: {unknown!r}")
        missing = sorted(self.required - data.keys())
        if missing:
            raise Misfit(path, f"lacks the required keys {missing!r} of {self.kind.__name__}")


class _Model(Conversion):
    """A Pydantic model: Pydantic validates and dumps it."""

    def __init__(self, kind: type) -> None:
        self.kind: Any = kind  # a pydantic.BaseModel, which this module does not import

    def dump(self, value: Any, path: str) -> Any:
        if not isinstance(value, self.kind):
            raise Misfit(path, f"should be {self.kind.__name__}, not {_shown(value)}")
        return value.model_dump(mode="json")

    def load(self, data: Any, path: str) -> Any:
        import pydantic  # loaded already: the model is one of its classes

        try:
            return self.kind.model_validate(data)
        except pydantic.ValidationError as exc:
            raise Misfit(path, f"is not a valid {self.kind.__name__}: {exc}") from None


def _is_model(kind: object) -> bool:
    """Whether ``kind`` is a Pydantic model class (without importing Pydantic)."""
    pydantic = sys.modules.get("pydantic")
    return (
        pydantic is not None
        and isinstance(kind, type)
        and issubclass(kind, pydantic.BaseModel)
        and kind is not pydantic.BaseModel
    )


def is_record(kind: object) -> bool:
    """Whether ``kind`` makes a codec: a dataclass, a TypedDict or a Pydantic model class."""
    return isinstance(kind, type) and (
        dataclasses.is_dataclass(kind) or typing.is_typeddict(kind) or _is_model(kind)
    )


_TEXT: dict[type, tuple[Callable[[str], Any], Callable[[Any], str]]] = {
    datetime: (datetime.fromisoformat, datetime.isoformat),
    date: (date.fromisoformat, date.isoformat),
    uuid.UUID: (uuid.UUID, str),
    Decimal: (Decimal, str),
}


def conversion(kind: Any, made: dict[type, Conversion]) -> Conversion:
    """The conversion of ``kind``; ``made`` holds the records already made (or being made)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is typing.Annotated:
        return conversion(args[0], made)
    if kind is Any or kind is object:
        return _Plain()
    if kind is None or kind is type(None):
        return _Exact(type(None))
    if kind in (str, bool, int):
        return _Exact(kind)
    if kind is float:
        return _Float()
    if kind in _TEXT:
        return _Text(kind, *_TEXT[kind])
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return _Enum(kind)
    if origin is typing.Literal:
        return _Literal(args)
    if origin is list and len(args) == 1:
        return _List(conversion(args[0], made))
    if origin is dict and len(args) == 2 and args[0] is str:
        return _Dict(conversion(args[1], made))
    if origin is typing.Union or origin is types.UnionType:
        return _Union([conversion(a, made) for a in args], " | ".join(map(type_name, args)))
    if _is_model(kind):
        return _Model(kind)
    if isinstance(kind, type) and (dataclasses.is_dataclass(kind) or typing.is_typeddict(kind)):
        if kind in made:
            return made[kind]
        record = made[kind] = _Fields(kind, typing.is_typeddict(kind))
        hints = typing.get_type_hints(kind)  # strips Required, NotRequired and Annotated
        if record.typed_dict:
            names = list(hints)
            record.required = _required_keys(kind)
        else:
            fields = [f for f in dataclasses.fields(kind) if f.init]
            names = [f.name for f in fields]
            record.required = frozenset(
                f.name
                for f in fields
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            )
        for name in names:
            record.fields[name] = conversion(hints[name], made)
        return record
    raise Unsupported(kind)


def _required_keys(kind: Any) -> frozenset[str]:
    """A TypedDict's required keys. Its ``__required_keys__`` alone would do, but Python 3.11
    cannot see ``NotRequired`` in an annotation given as text (``from __future__ import
    annotations``): the resolved annotations say it."""
    marked = typing.get_type_hints(kind, include_extras=True)

    def marker(key: str) -> object:
        hint = marked[key]
        while typing.get_origin(hint) is typing.Annotated:
            hint = typing.get_args(hint)[0]
        return typing.get_origin(hint)

    required: set[str] = set(kind.__required_keys__)
    required -= {key for key in required if marker(key) is typing.NotRequired}
    required |= {key for key in kind.__optional_keys__ if marker(key) is typing.Required}
    return frozenset(required)


class Unsupported(Exception):
    def __init__(self, kind: object) -> None:
        super().__init__(type_name(kind))


def type_name(kind: object) -> str:
    return kind.__name__ if isinstance(kind, type) else repr(kind).replace("typing.", "")
