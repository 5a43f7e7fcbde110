"""What a graph document may hold: the range of every integer field, and how many
of each element.

Decoding is typed (msgspec), and these constraints are part of the types, so a
value out of range is refused where it is read, naming its field, before any
pass packs it into a driver structure (``struct`` would fail there) or does
arithmetic on it. Addresses and sizes are unsigned 64-bit, launch dimensions and
parameter offsets unsigned 32-bit, as the driver's structures hold them.
msgspec checks bounds within int64 only, so 64-bit fields stop at 2**63 - 1: no
host or device address and no size a process can have reaches that.

The counts bound what decoding a graph may build, so that no offline command
needs more than 1 GiB on a graph within them (docs/archive-format.md, "Limits").
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


# -- counts ------------------------------------------------------------------------------------
#
# The largest real graphs Foundry has saved: SGLang's MoE preset (Qwen3-30B-A3B shape, 48 layers)
# makes about 700 kernel nodes per decode graph (36 graphs at max_running_requests 256, 52 at
# 512); vLLM's piecewise graphs are a few hundred nodes each (about 2,000 of them per rank); a
# 28-layer Qwen3 through transformers makes 1,850 nodes, the largest graph measured. The fixtures,
# SAVEd on the H200 test machine, hold 4 to 8 operands per node, 3 to 6 parameters and on average
# 14 undefined runs per kernel (122 at most) and 1.1-1.2 KiB of graph file per node. Every limit
# admits at least 4x the largest of those (most of them far more: 32,768 nodes is 4x a graph of
# 8,000); the graph file limit (32 MiB, foundry.archive.files.Limits) is 4x a graph of 7,000
# such nodes.

MAX_NODES = 32_768  # 4x an 8,000-node graph
MAX_EDGES = 65_536  # graphs are mostly chains: about one edge per node
MAX_OPERANDS = 131_072  # 4 per node at MAX_NODES (SGLang's graphs hold 8 per node: 17,000 nodes of them)
MAX_REGIONS = 16_384  # allocations and named tensors a graph points into
MAX_META = 256  # annotations of one graph
MAX_PARAMS = 4_096  # parameters of one kernel (the native builder's limit too)
MAX_PARAM_BYTES = 32_768  # a kernel's parameter buffer (CUDA allows 32,764 bytes)
MAX_UNDEFINED_RUNS = 1_024  # undefined runs of one kernel's parameters (seen: 122)
MAX_ATTRIBUTES = 16  # launch attributes of one node (11 kinds are recorded; real nodes have 1 or 2)
# Totals over one graph's kernels, for the elements whose decoded objects are many times their
# bytes in the file (an int of a layout takes 3 bytes there and 36 in memory): checked as
# nodes are decoded, one at a time, so a graph over them is refused before it is built.
# Each is 4 per kernel at MAX_NODES: real kernels have 3 to 6 parameters, 14 undefined runs
# and 1.3 launch attributes on average, so a 4x graph of the largest real one (7,400 nodes)
# holds at most 105,000 of any of them.
MAX_GRAPH_PARAMS = 131_072  # parameters of all kernels
MAX_GRAPH_UNDEFINED_RUNS = 131_072  # undefined runs of all kernels
MAX_GRAPH_ATTRIBUTES = 131_072  # launch attributes of all kernels
MAX_NAME = 65_536  # characters of a kernel name (the longest seen: about 2,200)
MAX_LABEL = 4_096  # characters of a region name, a graph name, a meta key or value, a detail

Name = Annotated[str, msgspec.Meta(max_length=MAX_LABEL)]


def at_most(count: int) -> msgspec.Meta:
    """A length constraint msgspec checks before decoding a single element (an array's header
    gives its length), so a document declaring millions of nodes costs nothing to refuse."""
    return msgspec.Meta(max_length=count)
