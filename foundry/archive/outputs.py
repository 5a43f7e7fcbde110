"""Allowlisted descriptions of a graph's outputs.

An output description is a nested structure of tensor specs, ints, floats,
bools, ``None``, tuples/lists/dicts (string keys) of those, and records: the
dataclasses named in :data:`RECORD_TYPES` (an engine's output object, such as
SGLang's ``LogitsProcessorOutput``), described field by field. Nothing else is
accepted when writing or reading; a LOAD imports only the classes listed there.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

import msgspec

from foundry.errors import ArchiveError

MAX_DEPTH = 32
MAX_ITEMS = 100_000

# record type name -> "module:qualname" of the dataclass it stands for
RECORD_TYPES: dict[str, str] = {
    "sglang.LogitsProcessorOutput": "sglang.srt.layers.logits_processor:LogitsProcessorOutput",
}

DTYPES = frozenset(
    {
        "bool",
        "uint8",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "bfloat16",
        "float32",
        "float64",
        "complex64",
        "complex128",
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
    }
)


class TensorSpec(msgspec.Struct, frozen=True, tag="tensor", forbid_unknown_fields=True):
    """A tensor the graph writes: dtype, geometry, and where its storage lives."""

    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int = 0
    region: str | None = None
    region_offset: int | None = None


class IntValue(msgspec.Struct, frozen=True, tag="int", forbid_unknown_fields=True):
    value: int


class FloatValue(msgspec.Struct, frozen=True, tag="float", forbid_unknown_fields=True):
    value: float


class BoolValue(msgspec.Struct, frozen=True, tag="bool", forbid_unknown_fields=True):
    value: bool


class NoneValue(msgspec.Struct, frozen=True, tag="none", forbid_unknown_fields=True):
    pass


class SeqValue(msgspec.Struct, frozen=True, tag="seq", forbid_unknown_fields=True):
    container: str  # "tuple" or "list"
    items: tuple[OutputValue, ...]


class DictValue(msgspec.Struct, frozen=True, tag="dict", forbid_unknown_fields=True):
    items: dict[str, OutputValue]


class RecordValue(msgspec.Struct, frozen=True, tag="record", forbid_unknown_fields=True):
    """An allowlisted dataclass instance: its record type name and its fields."""

    record: str
    fields: dict[str, OutputValue]


OutputValue = TensorSpec | IntValue | FloatValue | BoolValue | NoneValue | SeqValue | DictValue | RecordValue


def check_output(value: OutputValue, *, path: str, field: str = "outputs") -> None:
    """Refuse descriptions that are too deep, too large, or name unknown dtypes."""
    count = 0
    stack: list[tuple[OutputValue, int, str]] = [(value, 0, field)]
    while stack:
        item, depth, where = stack.pop()
        count += 1
        if depth > MAX_DEPTH or count > MAX_ITEMS:
            raise ArchiveError("output description is too deep or too large", path=path, field=where)
        if isinstance(item, TensorSpec):
            if item.dtype not in DTYPES:
                raise ArchiveError("unknown tensor dtype", path=path, field=f"{where}.dtype", found=item.dtype)
            if len(item.shape) != len(item.stride) or any(d < 0 for d in item.shape):
                raise ArchiveError("tensor shape and stride disagree", path=path, field=where)
        elif isinstance(item, SeqValue):
            if item.container not in ("tuple", "list"):
                raise ArchiveError("unknown container", path=path, field=f"{where}.container", found=item.container)
            stack.extend((v, depth + 1, f"{where}[{i}]") for i, v in enumerate(item.items))
        elif isinstance(item, DictValue):
            stack.extend((v, depth + 1, f"{where}.{k}") for k, v in item.items.items())
        elif isinstance(item, RecordValue):
            if item.record not in RECORD_TYPES:
                raise ArchiveError("unknown record type", path=path, field=f"{where}.record", found=item.record,
                                   expected=sorted(RECORD_TYPES))  # fmt: skip
            stack.extend((v, depth + 1, f"{where}.{k}") for k, v in item.fields.items())


def describe(value: Any, tensor: Callable[[Any], TensorSpec | None], *, depth: int = 0) -> OutputValue:
    """Describe a Python value; ``tensor`` turns a tensor into a spec (or ``None`` if
    ``value`` is not one). Anything outside the allowlist is refused."""
    if depth > MAX_DEPTH:
        raise ArchiveError("output structure is nested too deeply", field="outputs")
    spec = tensor(value)
    if spec is not None:
        return spec
    if value is None:
        return NoneValue()
    if isinstance(value, bool):
        return BoolValue(value)
    if isinstance(value, int):
        return IntValue(value)
    if isinstance(value, float):
        return FloatValue(value)
    if isinstance(value, tuple | list):
        container = "tuple" if isinstance(value, tuple) else "list"
        return SeqValue(container, tuple(describe(v, tensor, depth=depth + 1) for v in value))
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return DictValue({k: describe(v, tensor, depth=depth + 1) for k, v in value.items()})
    record = _record_type(value)
    if record is not None:
        fields = {f.name: describe(getattr(value, f.name), tensor, depth=depth + 1) for f in dataclasses.fields(value)}
        return RecordValue(record, fields)
    raise ArchiveError(f"outputs of type {type(value).__name__} cannot be described", field="outputs")


def rebuild(value: OutputValue, tensor: Callable[[TensorSpec], Any]) -> Any:
    """The Python value a description stands for; ``tensor`` makes each tensor."""
    if isinstance(value, TensorSpec):
        return tensor(value)
    if isinstance(value, IntValue | FloatValue | BoolValue):
        return value.value
    if isinstance(value, NoneValue):
        return None
    if isinstance(value, SeqValue):
        items = [rebuild(v, tensor) for v in value.items]
        return tuple(items) if value.container == "tuple" else items
    if isinstance(value, RecordValue):
        fields = {k: rebuild(v, tensor) for k, v in value.fields.items()}
        try:
            return _record_class(value.record)(**fields)
        except TypeError as err:  # fields the live class does not have (another version of it)
            raise ArchiveError(f"record fields do not match the live class: {err}", field="outputs",
                               found=value.record) from None  # fmt: skip
    return {k: rebuild(v, tensor) for k, v in value.items.items()}


def _record_type(value: Any) -> str | None:
    """The record type name of an allowlisted dataclass instance, else None."""
    if not dataclasses.is_dataclass(value) or isinstance(value, type):
        return None
    path = f"{type(value).__module__}:{type(value).__qualname__}"
    return next((name for name, known in RECORD_TYPES.items() if known == path), None)


def _record_class(name: str) -> type:
    """The allowlisted class a record type name stands for (imported on first use)."""
    if name not in RECORD_TYPES:
        raise ArchiveError("unknown record type", field="outputs", found=name, expected=sorted(RECORD_TYPES))
    module, qualname = RECORD_TYPES[name].split(":")
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target
