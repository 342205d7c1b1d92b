"""The payload's JSON: what may be enqueued (plain JSON, nested and sized within bounds every
worker can decode) and its one encoding, checked in Python before any SQL is sent.

A payload that breaks a rule raises :class:`~sa_jobqueue.errors.PayloadError` and leaves the
caller's transaction exactly as it was.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any, Final

from .errors import PayloadError

#: A payload's default size limit, as encoded JSON. A queue row is a message, not a blob store:
#: large inputs belong in a table of their own, referenced by id.
DEFAULT_MAX_PAYLOAD_BYTES: Final = 1_000_000
#: How deeply dicts and lists may nest in a payload. A fixed number, not this process's
#: recursion limit: whatever limit the enqueuing process set, every worker must decode what it
#: accepted. The worker's json.loads spends one level of Python's recursion limit (1,000 by
#: default) per level of nesting and starts some dozens of frames deep, and a handler that
#: walks the payload recursively needs room too; 200 leaves most of the limit to them.
#: PostgreSQL's jsonb takes thousands of levels.
MAX_PAYLOAD_DEPTH: Final = 200
#: Longest integer in a payload, in decimal digits: Python's default limit on converting
#: between int and str (``sys.int_info.default_max_str_digits``). A worker decodes with its own
#: process's limit, which is this one unless that process changed it; the enqueuing process's
#: own limit does not matter.
MAX_INT_DIGITS: Final = 4300
_TOO_LONG: Final = 10**MAX_INT_DIGITS  # the smallest integer of one digit too many
#: From here up, Python writes a float with an exponent ("1e+16"), and jsonb's numeric reads
#: that as a whole number of scale 0, which comes back as an int. Smaller floats are written
#: with a decimal point or a negative exponent ("1e-07"), which numeric keeps as a scale
#: ("0.0000001"), so they come back as floats.
_EXPONENT_FROM: Final = 1e16


def encode_payload(payload: Any, *, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> str:
    """Return the payload as compact JSON text, or raise PayloadError saying what is wrong.

    A payload that passes reaches the handler equal to what was sent and of the same type at
    every level (floats bit for bit), through PostgreSQL's jsonb and the worker's decoding. Not
    kept: the order of a dict's keys (jsonb sorts them). Refused, with the path of the value:
    what JSON has no form for (sets, bytes, tuples, non-str keys, NaN, infinities, NUL
    characters, lone surrogates), subclasses of JSON's types (an enum arrives as its plain
    value, so pass ``.value``), -0.0 (jsonb's numeric has no negative zero), integers of more
    than :data:`MAX_INT_DIGITS` digits and nesting deeper than :data:`MAX_PAYLOAD_DEPTH`.
    Floats of 1e16 and more, which Python writes with an exponent that jsonb would read as an
    integer, are written out in full with a ``.0`` (``10000000000000000.0``).
    """
    try:
        encoded = _encode(payload)
    except TypeError as exc:  # sets, bytes, datetimes, arbitrary objects
        raise PayloadError(f"payload is not JSON-serialisable: {exc}") from None
    except RecursionError:
        # Deeper than this process's recursion limit lets json encode: the walk says whether
        # it is also deeper than the fixed limit (it stops there, so it cannot recurse away).
        with contextlib.suppress(RecursionError):  # a process with hardly any room left
            _check(payload)
        raise PayloadError(
            "payload is nested too deeply for this process to encode (its recursion limit is"
            f" {sys.getrecursionlimit()})"
        ) from None
    except ValueError as exc:  # circular references, NaN and infinities, overlong integers
        if "Circular" in str(exc):
            raise PayloadError("payload contains a circular reference") from None
        _check(payload)  # raises, naming the value, for NaN, infinities and overlong integers
        raise PayloadError(f"payload cannot be encoded: {exc}") from None
    # One walk checks what json.dumps lets through: keys it turns into strings, tuples and
    # subclasses it turns into plain types, NUL (valid JSON, refused by jsonb), -0.0, overlong
    # integers, nesting, and floats that need writing out. It runs only when the payload is
    # not a flat dict of plain values or the text hints at trouble: a float of 1e16 or more
    # is written with "e+", -0.0 as "-0.0", and an overlong integer needs over 4,300
    # characters. Strings containing these only cost a walk.
    if (
        "\\u0000" in encoded
        or "e+" in encoded
        or "-0.0" in encoded
        or len(encoded) > MAX_INT_DIGITS
        or not _plain(payload)
    ) and _check(payload):
        encoded = _positional(payload)
    try:
        size = len(encoded.encode())
    except UnicodeEncodeError:  # a lone surrogate, e.g. from a badly decoded byte string
        raise PayloadError("payload contains a string that is not valid Unicode") from None
    if size > max_bytes:
        raise PayloadError(f"payload is {size} bytes of JSON, over the limit of {max_bytes}")
    return encoded


#: Compact JSON, characters as they are (the column is UTF-8 text), no NaN. One instance for
#: every payload: ``json.dumps`` with options builds a new encoder each call.
_ENCODER: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
#: ``_ENCODER``'s C encoder, made once (None where the interpreter has none): its ``encode``
#: makes one per call, which costs more than encoding a small payload. This one tracks no
#: cycles (a dict of them shared by threads would not be safe): a cycle recurses until
#: RecursionError, and :func:`_encode` then asks ``_ENCODER``, which says what it is.
_C_ENCODER: Final = (
    None
    if c_make_encoder is None
    else c_make_encoder(
        None, _ENCODER.default, encode_basestring, None, ":", ",", False, False, False
    )
)
_PLAIN_SCALARS: Final = frozenset({str, int, float, bool, type(None)})


def _encode(payload: Any) -> str:
    """``_ENCODER.encode(payload)``, the same text or the same exception, at less cost."""
    if _C_ENCODER is not None:
        try:
            return "".join(_C_ENCODER(payload, 0))
        except RecursionError:
            pass  # a cycle, or nesting too deep: the encoder that tracks cycles says which
    return _ENCODER.encode(payload)


def _plain(value: Any) -> bool:
    """A quick check for the common payload: a dict of str keys and plain scalar values."""
    kind = type(value)
    if kind is dict:
        for key, item in value.items():  # a loop: a generator per call costs as much again
            if type(key) is not str or type(item) not in _PLAIN_SCALARS:
                return False
        return True
    return kind in _PLAIN_SCALARS


def _check(payload: Any) -> bool:
    """Raise PayloadError for the first value that would not arrive intact, naming its path.

    Returns whether some float must be written out in full (see :func:`_positional`).
    """
    try:
        return _walk(payload, 0)
    except _Refusal as refusal:
        path = "payload" + "".join(
            f"[{json.dumps(key, ensure_ascii=False)}]" if isinstance(key, str) else f"[{key}]"
            for key in reversed(refusal.keys)
        )
        raise PayloadError(f"{path} {refusal.message}") from None


class _Refusal(Exception):
    """Raised inside :func:`_walk`; each container on the way out adds its key or index.

    The path is built only for a refused payload, so an accepted one costs no string work.
    """

    def __init__(self, message: str) -> None:
        self.message = message  # what follows the path
        self.keys: list[str | int] = []


def _walk(value: Any, depth: int) -> bool:
    """:func:`_check`'s walk; ``depth`` is the number of containers around ``value``."""
    kind = type(value)
    if kind is str:
        if "\x00" in value:
            raise _Refusal("contains a NUL character, which PostgreSQL cannot store")
        return False
    if kind is dict or kind is list:
        if depth >= MAX_PAYLOAD_DEPTH:
            raise PayloadError(  # not a _Refusal: no path, which would be long and say nothing
                f"payload is nested too deeply: more than {MAX_PAYLOAD_DEPTH} levels of dicts"
                " and lists"
            )
        positional = False
        if kind is dict:
            for key, item in value.items():
                if type(key) is not str:
                    raise _Refusal(
                        f"has a key {key!r} of type {type(key).__name__}; JSON keys"
                        " are plain strings"
                    )
                if "\x00" in key:
                    raise _Refusal("has a key with a NUL character")
                try:
                    positional |= _walk(item, depth + 1)
                except _Refusal as refusal:
                    refusal.keys.append(key)
                    raise
        else:
            for index, item in enumerate(value):
                try:
                    positional |= _walk(item, depth + 1)
                except _Refusal as refusal:
                    refusal.keys.append(index)
                    raise
        return positional
    if kind is float:
        if not math.isfinite(value):
            raise _Refusal(f"is {value}, which JSON cannot carry")
        if value == 0.0 and math.copysign(1.0, value) < 0:
            raise _Refusal(
                "is -0.0: PostgreSQL's jsonb has no negative zero and would hand back 0.0; send 0.0"
            )
        magnitude: float = abs(value)
        return magnitude >= _EXPONENT_FROM
    if kind is int:
        if not -_TOO_LONG < value < _TOO_LONG:
            raise _Refusal(
                f"is an integer of more than {MAX_INT_DIGITS} digits, which a worker"
                " cannot decode (Python's int-string conversion limit); send it as a string"
            )
        return False
    if kind is bool or value is None:
        return False
    if kind is tuple:
        raise _Refusal("is a tuple; JSON would hand it back as a list, so pass a list")
    for base in (bool, int, float, str, dict, list):
        if isinstance(value, base):
            raise _Refusal(
                f"is a {kind.__name__}, which would arrive as a plain {base.__name__};"
                f" pass a {base.__name__} (for an enum, its .value)"
            )
    raise _Refusal(f"is a {kind.__name__}, which JSON cannot carry")


def _positional(value: Any) -> str:
    """The payload's JSON text, as the encoder writes it but for floats of 1e16 and more.

    Those are written in full with one decimal: every float that large is a whole number, so
    the text is its exact value, jsonb's numeric keeps it with its scale of one, and the
    worker's json.loads reads a float again. Only for payloads :func:`_check` has passed.
    """
    parts: list[str] = []
    _write(value, parts)
    return "".join(parts)


def _write(value: Any, parts: list[str]) -> None:
    kind = type(value)
    if kind is float and abs(value) >= _EXPONENT_FROM:
        parts.append(format(value, ".1f"))
    elif kind is dict:
        parts.append("{")
        for index, (key, item) in enumerate(value.items()):
            if index:
                parts.append(",")
            parts.append(_ENCODER.encode(key))
            parts.append(":")
            _write(item, parts)
        parts.append("}")
    elif kind is list:
        parts.append("[")
        for index, item in enumerate(value):
            if index:
                parts.append(",")
            _write(item, parts)
        parts.append("]")
    else:
        parts.append(_ENCODER.encode(value))
