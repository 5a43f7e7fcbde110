"""Typed graph nodes. One frozen struct per node kind, stored under one networkx
attribute key (:data:`foundry.graphir.graph.NODE_KEY`).

Raw addresses stay in the nodes exactly as captured; the operand manifest says
which of them are pointers and where they point (``operands.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, ClassVar, Literal

import msgspec

from foundry.graphir.kernel import FuncAttribute, KernelIdentity, LaunchConfig, ParamLayout
from foundry.graphir.kinds import NodeKind
from foundry.graphir.limits import MAX_ATTRIBUTES, MAX_PARAM_BYTES, MAX_UNDEFINED_RUNS, U32, U64, Name, at_most

#: How a copy's source or destination is addressed (``CUmemorytype``).
MemoryType = Literal["host", "device", "array", "unified"]


class KernelNode(msgspec.Struct, frozen=True, gc=False, tag="kernel", forbid_unknown_fields=True):
    """A kernel launch with its parameter buffer as the device sees it.

    ``params`` is the device-side parameter buffer (``layout.size`` bytes).
    ``arg_mode`` says how the capture passed it: ``params`` (``kernelParams``)
    or ``extra`` (one packed buffer, as cuBLAS does). ``packed_size``, when set,
    is the size of an ``extra`` buffer shorter than the layout: NCCL passes
    only the bytes it uses of its 4 KiB argument structure; ``params`` then
    holds those bytes, zero-filled to ``layout.size``, and LOAD passes the same
    shorter buffer again.
    """

    id: U32
    kernel: KernelIdentity
    launch: LaunchConfig
    layout: ParamLayout
    params: Annotated[bytes, at_most(MAX_PARAM_BYTES)]
    arg_mode: Literal["params", "extra"] = "params"
    func_attrs: Annotated[tuple[FuncAttribute, ...], at_most(MAX_ATTRIBUTES)] = ()
    # (offset, length) runs of ``params`` the launcher left uninitialised: they
    # differed between two captures of the same step (see foundry.graphir.passes.definedness)
    undefined: Annotated[tuple[tuple[U32, U32], ...], at_most(MAX_UNDEFINED_RUNS)] = ()
    packed_size: U32 | msgspec.UnsetType = msgspec.UNSET  # unset (not written) unless shorter

    kind: ClassVar[NodeKind] = NodeKind.KERNEL

    def launch_bytes(self) -> int:
        """How many bytes of ``params`` the launch passes to the driver."""
        return self.packed_size or len(self.params)

    def undefined_offsets(self) -> set[int]:
        """Every byte offset of ``params`` inside an ``undefined`` run (SAVE merges its own
        captures' marks with these; readers of archives use :meth:`undefined_ranges`)."""
        return {i for offset, length in self.undefined for i in range(offset, offset + length)}

    def undefined_ranges(self) -> list[tuple[int, int]]:
        """The ``undefined`` runs as sorted, merged ``[start, end)`` byte ranges."""
        return merged_ranges((offset, offset + length) for offset, length in self.undefined)

    def param_bytes(self, index: int) -> bytes:
        slot = self.layout.slots[index]
        return self.params[slot.offset : slot.end]


class MemcpyNode(msgspec.Struct, frozen=True, gc=False, tag="memcpy", forbid_unknown_fields=True):
    """A 3D memory copy (``CUDA_MEMCPY3D``) between device, host or unified memory.

    ``src``/``dst`` are the base addresses; the ``*_pos`` triples are the
    x (bytes), y, z offsets; ``extent`` is width in bytes, height, depth.
    """

    id: U32
    src_type: MemoryType
    dst_type: MemoryType
    src: U64
    dst: U64
    extent: tuple[U64, U64, U64]
    src_pos: tuple[U64, U64, U64] = (0, 0, 0)
    dst_pos: tuple[U64, U64, U64] = (0, 0, 0)
    src_pitch: U64 = 0
    src_height: U64 = 0
    dst_pitch: U64 = 0
    dst_height: U64 = 0

    kind: ClassVar[NodeKind] = NodeKind.MEMCPY


class MemsetNode(msgspec.Struct, frozen=True, gc=False, tag="memset", forbid_unknown_fields=True):
    """A 2D memset of 1, 2 or 4-byte elements (``CUDA_MEMSET_NODE_PARAMS``)."""

    id: U32
    dst: U64
    value: U32
    element_size: Literal[1, 2, 4]
    width: U64
    height: U64 = 1
    pitch: U64 = 0

    kind: ClassVar[NodeKind] = NodeKind.MEMSET


class EventRecordNode(msgspec.Struct, frozen=True, gc=False, tag="event_record", forbid_unknown_fields=True):
    """Records an event. ``event`` numbers the graph's events by first use, so the
    record and the waits on one event share a number across processes."""

    id: U32
    event: U32

    kind: ClassVar[NodeKind] = NodeKind.EVENT_RECORD


class EventWaitNode(msgspec.Struct, frozen=True, gc=False, tag="event_wait", forbid_unknown_fields=True):
    """Waits on an event (numbered as in :class:`EventRecordNode`)."""

    id: U32
    event: U32

    kind: ClassVar[NodeKind] = NodeKind.EVENT_WAIT


class EmptyNode(msgspec.Struct, frozen=True, gc=False, tag="empty", forbid_unknown_fields=True):
    """A node that only orders its neighbours."""

    id: U32

    kind: ClassVar[NodeKind] = NodeKind.EMPTY


class UnsupportedNode(msgspec.Struct, frozen=True, gc=False, tag="unsupported", forbid_unknown_fields=True):
    """A node Foundry lowers but cannot restore (host callbacks, child graphs,
    memory alloc/free, conditionals, ...). Kept so lint can name it."""

    id: U32
    node_type: NodeKind
    detail: Name = ""

    @property
    def kind(self) -> NodeKind:
        return self.node_type


def merged_ranges(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """``[start, end)`` ranges sorted and merged where they touch or overlap: byte sets kept
    as ranges, so their size never depends on how many bytes they hold."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(r for r in ranges if r[0] < r[1]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def ranges_size(ranges: Iterable[tuple[int, int]]) -> int:
    """How many bytes merged ranges hold."""
    return sum(end - start for start, end in ranges)


def ranges_minus(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    """How many bytes of merged ranges ``a`` lie outside merged ranges ``b`` (one pass over both)."""
    inside, j = 0, 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            inside += min(end, b[k][1]) - max(start, b[k][0])
            k += 1
    return ranges_size(a) - inside


Node = KernelNode | MemcpyNode | MemsetNode | EventRecordNode | EventWaitNode | EmptyNode | UnsupportedNode
