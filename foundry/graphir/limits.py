"""What a graph document may hold: the range of every integer field.

Decoding is typed (msgspec), and these constraints are part of the types, so a
value out of range is refused where it is read, naming its field, before any
pass packs it into a driver structure (``struct`` would fail there) or does
arithmetic on it. Addresses and sizes are unsigned 64-bit, launch dimensions and
parameter offsets unsigned 32-bit, as the driver's structures hold them.
msgspec checks bounds within int64 only, so 64-bit fields stop at 2**63 - 1: no
host or device address and no size a process can have reaches that.
"""

from __future__ import annotations

import math
from typing import Annotated

import msgspec

U8 = Annotated[int, msgspec.Meta(ge=0, lt=1 << 8)]
U32 = Annotated[int, msgspec.Meta(ge=0, lt=1 << 32)]
U64 = Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)]
I32 = Annotated[int, msgspec.Meta(ge=-(1 << 31), lt=1 << 31)]
I64 = Annotated[int, msgspec.Meta(ge=-(1 << 63), le=(1 << 63) - 1)]
DIM = Annotated[int, msgspec.Meta(ge=1, lt=1 << 32)]  # a grid or block dimension: at least 1
SIZE = Annotated[int, msgspec.Meta(gt=0, le=(1 << 63) - 1)]  # a region's size: at least one byte
SHA256 = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]


def is_uint(value: object, bits: int) -> bool:
    """Whether ``value`` is an ``int`` (not a ``bool``) in ``[0, 2**bits)``."""
    return type(value) is int and 0 <= value < 1 << bits


def is_int(value: object, bits: int) -> bool:
    """Whether ``value`` is an ``int`` (not a ``bool``) that fits a signed ``bits``-bit integer."""
    return type(value) is int and -(1 << (bits - 1)) <= value < 1 << (bits - 1)


def is_fraction(value: object) -> bool:
    """Whether ``value`` is a finite number in ``[0, 1]`` (never NaN or infinite)."""
    return type(value) in (int, float) and math.isfinite(value) and 0 <= value <= 1
