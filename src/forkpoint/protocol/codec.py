"""Convert the op models (dataclasses) to and from their JSON form.

Supported field types: bool, int, float, str, bytes (base64 on the wire), ``X | None``,
``list[X]``, ``dict[str, X]`` and nested model dataclasses. Decoding is strict: unknown or
missing fields and wrong types raise BadArguments.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import math
import types
import typing
from functools import cache
from typing import Any, TypeVar

from .errors import BadArguments

__all__ = ["from_wire", "to_wire"]

T = TypeVar("T")


@cache
def _hints(cls: Any) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def to_wire(model: object) -> dict[str, Any]:
    """A model dataclass instance as a JSON-ready dict (bytes become base64 strings)."""
    if not dataclasses.is_dataclass(model) or isinstance(model, type):
        raise TypeError(f"not a model instance: {model!r}")
    # An optional field left at None is left out: a newer host's new optional fields then
    # reach an older agent (whose strict decoder refuses unknown names) only when used.
    return {
        f.name: _encode(value)
        for f in dataclasses.fields(model)
        if (value := getattr(model, f.name)) is not None or f.default is not None
    }


def _encode(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(value).decode("ascii")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_wire(value)
    if isinstance(value, list | tuple):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    return value


def from_wire(cls: type[T], data: object, *, what: str = "args") -> T:
    """Build model ``cls`` from its JSON form.

    Raises BadArguments for unknown/missing fields, wrong types, bad base64, or a value the
    model's own validation (``__post_init__`` raising ValueError) refuses.
    """
    if not isinstance(data, dict):
        raise BadArguments(f"{what} must be an object")
    hints = _hints(typing.cast(Any, cls))
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise BadArguments(f"unknown field(s) in {what}: {', '.join(map(str, unknown))}")
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        if name in data:
            kwargs[name] = _decode(hints[name], data[name], f"{what}.{name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise BadArguments(f"missing field {what}.{name}")
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as e:
        raise BadArguments(str(e)) from None


def _decode(tp: Any, value: Any, what: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None:
            if type(None) in options:
                return None
            raise BadArguments(f"{what} must not be null")
        inner = [o for o in options if o is not type(None)]
        if len(inner) != 1:
            raise TypeError(f"unsupported union {tp!r}")
        return _decode(inner[0], value, what)
    if origin is list:
        if not isinstance(value, list):
            raise BadArguments(f"{what} must be a list")
        (item,) = typing.get_args(tp)
        return [_decode(item, v, f"{what}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise BadArguments(f"{what} must be an object")
        _, item = typing.get_args(tp)
        return {str(k): _decode(item, v, f"{what}.{k}") for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise BadArguments(f"{what} must be a boolean")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadArguments(f"{what} must be an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise BadArguments(f"{what} must be a number")
        if not math.isfinite(value):
            raise BadArguments(f"{what} must be finite")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise BadArguments(f"{what} must be a string")
        return value
    if tp is bytes:
        if not isinstance(value, str):
            raise BadArguments(f"{what} must be a base64 string")
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise BadArguments(f"{what} is not valid base64") from None
    if dataclasses.is_dataclass(tp):
        return from_wire(tp, value, what=what)  # type: ignore[arg-type]
    raise TypeError(f"unsupported field type {tp!r}")
